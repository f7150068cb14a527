//! Limits: the NIC reports at least the required VIs, descriptors per
//! queue, transfer size and segments, and honours what it reports.

use via::{DescBuilder, Error, Region, Reliability, ViAttributes};
use via_tests::*;

#[test]
fn reported_attributes() {
    let nic = open_nic();
    let a = nic.attributes();
    assert!(a.max_vi >= 1024, "MaxVI {}", a.max_vi);
    assert!(
        a.max_descriptors_per_queue >= 1024,
        "MaxDescriptorsPerQueue {}",
        a.max_descriptors_per_queue
    );
    assert!(
        a.max_transfer_size >= 65536,
        "MaxTransferSize {}",
        a.max_transfer_size
    );
    assert!(
        a.max_segments_per_desc >= 16,
        "MaxSegmentsPerDesc {}",
        a.max_segments_per_desc
    );
    assert!(a.thread_safe);
    assert!(a.reliability_level_support >= Reliability::ReliableReception.bits());
    assert!(a.max_discriminator_len >= 16);
    assert_eq!(a.local_address, nic.host_address());
    let _ = nic.close();
}

#[test]
fn max_vis_per_nic() {
    let nic = open_nic();
    let n = nic.attributes().max_vi as usize;
    let ptag = nic.create_ptag().unwrap();
    let at = ViAttributes::new(Reliability::ReliableDelivery, ptag);
    let vis: Vec<_> = (0..n)
        .map(|i| {
            nic.create_vi(&at, None, None)
                .unwrap_or_else(|e| panic!("VI {i}: {e:?}"))
        })
        .collect();
    assert_eq!(
        nic.create_vi(&at, None, None).err(),
        Some(Error::Resource),
        "VI {n} + 1"
    );
    // Freeing one makes room for one.
    let last = vis.into_iter().last().unwrap();
    last.destroy().unwrap();
    let again = nic.create_vi(&at, None, None).unwrap();
    assert_eq!(nic.create_vi(&at, None, None).err(), Some(Error::Resource));
    drop(again);
    let _ = nic.close();
}

#[test]
fn max_receives_per_queue() {
    let nic = open_nic();
    let n = nic.attributes().max_descriptors_per_queue as usize;
    let ptag = nic.create_ptag().unwrap();
    let mem = Region::new(&nic, (n + 1) * 64 + 4096, ptag, false, false).unwrap();
    let vi = nic
        .create_vi(
            &ViAttributes::new(Reliability::ReliableDelivery, ptag),
            None,
            None,
        )
        .unwrap();
    let buf = (n + 1) * 64;
    for i in 0..=n {
        DescBuilder::recv()
            .segment(&mem, buf, 64)
            .write(&mem, i * 64)
            .unwrap();
    }
    for i in 0..n {
        vi.post_recv(&mem, i * 64)
            .unwrap_or_else(|e| panic!("receive {i}: {e:?}"));
    }
    assert_eq!(
        vi.post_recv(&mem, n * 64),
        Err(Error::Resource),
        "receive {n} + 1"
    );
    assert_eq!(vi.queues_empty(), (true, false));
    let _ = nic.close();
}
