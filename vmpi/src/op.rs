//! Reduction operations: the predefined ones and user functions, with
//! MPI's convention `inout = in ∘ inout` (`in` is the left operand, which
//! is what keeps the order of a non-commutative operation).
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::datatype::{Datatype, Kind, PairValue};
use crate::error::{Error, Result};

/// A predefined operation (the `MPI_Op` value of `mpi.h` is `self as i32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    /// `MPI_MAX`.
    Max = 1,
    /// `MPI_MIN`.
    Min = 2,
    /// `MPI_SUM`.
    Sum = 3,
    /// `MPI_PROD`.
    Prod = 4,
    /// `MPI_LAND`.
    Land = 5,
    /// `MPI_BAND`.
    Band = 6,
    /// `MPI_LOR`.
    Lor = 7,
    /// `MPI_BOR`.
    Bor = 8,
    /// `MPI_LXOR`.
    Lxor = 9,
    /// `MPI_BXOR`.
    Bxor = 10,
    /// `MPI_MAXLOC`.
    Maxloc = 11,
    /// `MPI_MINLOC`.
    Minloc = 12,
}

/// Every predefined operation.
pub const BUILTINS: [Builtin; 12] = [
    Builtin::Max,
    Builtin::Min,
    Builtin::Sum,
    Builtin::Prod,
    Builtin::Land,
    Builtin::Band,
    Builtin::Lor,
    Builtin::Bor,
    Builtin::Lxor,
    Builtin::Bxor,
    Builtin::Maxloc,
    Builtin::Minloc,
];

/// A user function: `inout = in ∘ inout` over whole buffers of `Datatype`.
pub type UserFn = Arc<dyn Fn(&[u8], &mut [u8], Datatype) + Send + Sync>;

/// A reduction operation.
#[derive(Clone)]
pub enum Op {
    /// Predefined.
    Builtin(Builtin),
    /// A user function (`MPI_Op_create`).
    User {
        /// The function.
        f: UserFn,
        /// Whether it commutes (algorithms that reorder need it).
        commute: bool,
    },
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Builtin(b) => write!(f, "{b:?}"),
            Op::User { commute, .. } => write!(f, "User(commute: {commute})"),
        }
    }
}

macro_rules! zip {
    ($t:ty, $a:expr, $b:expr, $f:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        let f = $f;
        if let (Ok(x), Ok(y)) = (<[u8; N]>::try_from($a), <&mut [u8; N]>::try_from(&mut *$b)) {
            // One element (an 8-byte allreduce of doubles): no slice casts.
            *y = f(<$t>::from_ne_bytes(x), <$t>::from_ne_bytes(*y)).to_ne_bytes();
        } else {
            zip_slices!($t, $a, $b, f)
        }
    }};
}

macro_rules! zip_slices {
    ($t:ty, $a:expr, $b:expr, $f:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        let f = $f;
        match (
            bytemuck::try_cast_slice::<u8, $t>($a),
            bytemuck::try_cast_slice_mut::<u8, $t>($b),
        ) {
            (Ok(x), Ok(y)) => {
                for (x, y) in x.iter().zip(y.iter_mut()) {
                    *y = f(*x, *y);
                }
            }
            _ => {
                for (x, y) in $a.chunks_exact(N).zip($b.chunks_exact_mut(N)) {
                    let xv = <$t>::from_ne_bytes(x.try_into().unwrap());
                    let yv = <$t>::from_ne_bytes((&*y).try_into().unwrap());
                    y.copy_from_slice(&f(xv, yv).to_ne_bytes());
                }
            }
        }
    }};
}

macro_rules! int_op {
    ($t:ty, $op:expr, $a:expr, $b:expr) => {{
        match $op {
            Builtin::Max => zip!($t, $a, $b, |x: $t, y: $t| x.max(y)),
            Builtin::Min => zip!($t, $a, $b, |x: $t, y: $t| x.min(y)),
            Builtin::Sum => zip!($t, $a, $b, |x: $t, y: $t| x.wrapping_add(y)),
            Builtin::Prod => zip!($t, $a, $b, |x: $t, y: $t| x.wrapping_mul(y)),
            Builtin::Land => zip!($t, $a, $b, |x: $t, y: $t| ((x != 0) && (y != 0)) as $t),
            Builtin::Lor => zip!($t, $a, $b, |x: $t, y: $t| ((x != 0) || (y != 0)) as $t),
            Builtin::Lxor => zip!($t, $a, $b, |x: $t, y: $t| ((x != 0) != (y != 0)) as $t),
            Builtin::Band => zip!($t, $a, $b, |x: $t, y: $t| x & y),
            Builtin::Bor => zip!($t, $a, $b, |x: $t, y: $t| x | y),
            Builtin::Bxor => zip!($t, $a, $b, |x: $t, y: $t| x ^ y),
            _ => return Err(unsupported($op)),
        }
    }};
}

macro_rules! float_op {
    ($t:ty, $op:expr, $a:expr, $b:expr) => {{
        match $op {
            Builtin::Max => zip!($t, $a, $b, |x: $t, y: $t| if x > y { x } else { y }),
            Builtin::Min => zip!($t, $a, $b, |x: $t, y: $t| if x < y { x } else { y }),
            Builtin::Sum => zip!($t, $a, $b, |x: $t, y: $t| x + y),
            Builtin::Prod => zip!($t, $a, $b, |x: $t, y: $t| x * y),
            _ => return Err(unsupported($op)),
        }
    }};
}

fn unsupported(op: Builtin) -> Error {
    Error::Op(format!("{op:?} is not defined for this datatype"))
}

/// MAXLOC/MINLOC over (value, index) pairs: the better value, and the
/// smaller index on a tie.
macro_rules! loc_op {
    ($t:ty, $op:expr, $a:expr, $b:expr, $dt:expr, $idx:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        let size = $dt.size;
        for (x, y) in $a.chunks_exact(size).zip($b.chunks_exact_mut(size)) {
            let xv = <$t>::from_ne_bytes(x[..N].try_into().unwrap());
            let yv = <$t>::from_ne_bytes(y[..N].try_into().unwrap());
            let xi = i32::from_ne_bytes(x[$idx..$idx + 4].try_into().unwrap());
            let yi = i32::from_ne_bytes(y[$idx..$idx + 4].try_into().unwrap());
            let take_x = match $op {
                Builtin::Maxloc => xv > yv || (xv == yv && xi < yi),
                Builtin::Minloc => xv < yv || (xv == yv && xi < yi),
                _ => return Err(unsupported($op)),
            };
            if take_x {
                y[..N].copy_from_slice(&x[..N]);
                y[$idx..$idx + 4].copy_from_slice(&x[$idx..$idx + 4]);
            }
        }
    }};
}

impl Builtin {
    /// The operation of handle value `id`.
    ///
    /// # Errors
    /// `Op` for an unknown value.
    pub fn from_id(id: i32) -> Result<Builtin> {
        // Handles are 1, 2, .. in the order of `BUILTINS` (checked by a test).
        usize::try_from(id)
            .ok()
            .and_then(|i| BUILTINS.get(i.wrapping_sub(1)))
            .copied()
            .ok_or_else(|| Error::Op(format!("unknown operation {id}")))
    }

    /// Whether [`Builtin::apply`] is defined for elements of `kind`.
    pub fn defined_for(self, kind: Kind) -> bool {
        use Builtin::*;
        match kind {
            Kind::Int(_) | Kind::Uint(_) => !matches!(self, Maxloc | Minloc),
            Kind::F32 | Kind::F64 => matches!(self, Max | Min | Sum | Prod),
            Kind::Bool => matches!(self, Land | Lor | Lxor),
            Kind::Byte => matches!(self, Band | Bor | Bxor),
            Kind::Pair(..) => matches!(self, Maxloc | Minloc),
            Kind::Opaque => false,
        }
    }

    /// `inout = input ∘ inout` element-wise.
    ///
    /// # Errors
    /// `Op` if the operation is not defined for the datatype.
    pub fn apply(self, dt: Datatype, input: &[u8], inout: &mut [u8]) -> Result<()> {
        let (a, b) = (input, inout);
        match dt.kind {
            Kind::Int(1) => int_op!(i8, self, a, b),
            Kind::Int(2) => int_op!(i16, self, a, b),
            Kind::Int(4) => int_op!(i32, self, a, b),
            Kind::Int(_) => int_op!(i64, self, a, b),
            Kind::Uint(1) => int_op!(u8, self, a, b),
            Kind::Uint(2) => int_op!(u16, self, a, b),
            Kind::Uint(4) => int_op!(u32, self, a, b),
            Kind::Uint(_) => int_op!(u64, self, a, b),
            Kind::F32 => float_op!(f32, self, a, b),
            Kind::F64 => float_op!(f64, self, a, b),
            Kind::Bool => match self {
                Builtin::Land | Builtin::Lor | Builtin::Lxor => int_op!(u8, self, a, b),
                _ => return Err(unsupported(self)),
            },
            Kind::Byte => match self {
                Builtin::Band | Builtin::Bor | Builtin::Bxor => int_op!(u8, self, a, b),
                _ => return Err(unsupported(self)),
            },
            Kind::Pair(v, idx) => {
                let idx = idx as usize;
                match v {
                    PairValue::F32 => loc_op!(f32, self, a, b, dt, idx),
                    PairValue::F64 => loc_op!(f64, self, a, b, dt, idx),
                    PairValue::I64 => loc_op!(i64, self, a, b, dt, idx),
                    PairValue::I32 => loc_op!(i32, self, a, b, dt, idx),
                    PairValue::I16 => loc_op!(i16, self, a, b, dt, idx),
                }
            }
            Kind::Opaque => {
                return Err(Error::Op(format!(
                    "no operation is defined for {}",
                    dt.name
                )));
            }
        }
        Ok(())
    }
}

impl Op {
    /// Whether the operation commutes.
    pub fn commutative(&self) -> bool {
        match self {
            Op::Builtin(_) => true,
            Op::User { commute, .. } => *commute,
        }
    }

    /// Checks that the operation is defined for `dt` (before any transfer,
    /// so that every process reports the error instead of waiting).
    ///
    /// # Errors
    /// `Op` if it is not.
    pub fn check(&self, dt: Datatype) -> Result<()> {
        match self {
            Op::Builtin(b) if b.defined_for(dt.kind) => Ok(()),
            Op::Builtin(b) => {
                // The error `apply` gives: one element of zeros.
                let (x, mut y) = ([0u64; 8], [0u64; 8]);
                let n = dt.size.min(64);
                b.apply(
                    dt,
                    &bytemuck::cast_slice(&x)[..n],
                    &mut bytemuck::cast_slice_mut(&mut y)[..n],
                )
            }
            Op::User { .. } => Ok(()),
        }
    }

    /// `inout = input ∘ inout`.
    ///
    /// # Errors
    /// `Op` if the operation is not defined for the datatype.
    pub fn apply(&self, dt: Datatype, input: &[u8], inout: &mut [u8]) -> Result<()> {
        debug_assert_eq!(input.len(), inout.len());
        match self {
            Op::Builtin(b) => b.apply(dt, input, inout),
            Op::User { f, .. } => {
                if !input.is_empty() {
                    f(input, inout, dt);
                }
                Ok(())
            }
        }
    }

    /// `acc = acc ∘ right` (the accumulator on the left).
    ///
    /// # Errors
    /// As [`Op::apply`].
    pub fn apply_right(&self, dt: Datatype, acc: &mut [u8], right: &[u8]) -> Result<()> {
        if self.commutative() {
            return self.apply(dt, right, acc);
        }
        let mut tmp = right.to_vec();
        self.apply(dt, acc, &mut tmp)?;
        acc.copy_from_slice(&tmp);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::*;

    #[test]
    fn defined_exactly_where_apply_works() {
        for b in BUILTINS {
            assert_eq!(Builtin::from_id(b as i32).unwrap(), b);
            for dt in ALL {
                let (x, mut y) = ([0u8; 16], [0u8; 16]);
                let works = b.apply(*dt, &x[..dt.size], &mut y[..dt.size]).is_ok();
                assert_eq!(b.defined_for(dt.kind), works, "{b:?} on {}", dt.name);
                assert_eq!(Op::Builtin(b).check(*dt).is_ok(), works);
            }
        }
        for bad in [0, -1, 13, 99, i32::MIN] {
            assert!(Builtin::from_id(bad).is_err());
        }
    }

    #[test]
    fn sums_and_locs() {
        let a: Vec<u8> = bytemuck::cast_slice(&[1i32, 2, 3]).to_vec();
        let mut b: Vec<u8> = bytemuck::cast_slice(&[10i32, 20, 30]).to_vec();
        Builtin::Sum.apply(INT, &a, &mut b).unwrap();
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&b), &[11, 22, 33]);
        // Misaligned buffers take the byte-wise path.
        let mut x = [0u8; 9];
        x[1..9].copy_from_slice(&2.5f64.to_ne_bytes());
        let mut y = 4.0f64.to_ne_bytes().to_vec();
        Builtin::Max.apply(DOUBLE, &x[1..], &mut y).unwrap();
        assert_eq!(f64::from_ne_bytes(y[..].try_into().unwrap()), 4.0);
        let pair = |v: i32, i: i32| [v.to_ne_bytes(), i.to_ne_bytes()].concat();
        let mut p = pair(5, 3);
        Builtin::Maxloc.apply(TWO_INT, &pair(5, 1), &mut p).unwrap();
        assert_eq!(p, pair(5, 1));
        assert!(Builtin::Band.apply(DOUBLE, &y.clone(), &mut y).is_err());
        assert!(Builtin::Sum.apply(BYTE, &[1], &mut [2]).is_err());
    }
}
