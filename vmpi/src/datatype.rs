//! The predefined datatypes: contiguous elements of a fixed size, each
//! with the element kind the reduction operations compute on.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};

/// What the elements of a datatype are, for reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Signed integers of this many bytes.
    Int(u8),
    /// Unsigned integers of this many bytes.
    Uint(u8),
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// Bytes (`MPI_BYTE`, `MPI_PACKED`): bitwise operations only.
    Byte,
    /// C `bool`.
    Bool,
    /// A (value, int index) pair for `MAXLOC`/`MINLOC`: the value's kind and
    /// the index's byte offset.
    Pair(PairValue, u8),
    /// No arithmetic (`MPI_LONG_DOUBLE`): transfer only.
    Opaque,
}

/// The value of a `MAXLOC`/`MINLOC` pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairValue {
    /// `float`.
    F32,
    /// `double`.
    F64,
    /// `long`.
    I64,
    /// `int`.
    I32,
    /// `short`.
    I16,
}

/// A predefined datatype (the `MPI_Datatype` value of `mpi.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Datatype {
    /// The handle value in `mpi.h`.
    pub id: i32,
    /// Bytes per element (its extent).
    pub size: usize,
    /// Element kind.
    pub kind: Kind,
    /// Name, for messages.
    pub name: &'static str,
}

macro_rules! types {
    ($($c:ident = $id:literal, $size:literal, $kind:expr, $name:literal;)*) => {
        $(
            #[doc = concat!("`", $name, "`.")]
            pub const $c: Datatype = Datatype { id: $id, size: $size, kind: $kind, name: $name };
        )*
        /// Every predefined datatype.
        pub const ALL: &[Datatype] = &[$($c),*];
    };
}

types! {
    CHAR = 1, 1, Kind::Int(1), "MPI_CHAR";
    SIGNED_CHAR = 2, 1, Kind::Int(1), "MPI_SIGNED_CHAR";
    UNSIGNED_CHAR = 3, 1, Kind::Uint(1), "MPI_UNSIGNED_CHAR";
    BYTE = 4, 1, Kind::Byte, "MPI_BYTE";
    SHORT = 5, 2, Kind::Int(2), "MPI_SHORT";
    UNSIGNED_SHORT = 6, 2, Kind::Uint(2), "MPI_UNSIGNED_SHORT";
    INT = 7, 4, Kind::Int(4), "MPI_INT";
    UNSIGNED = 8, 4, Kind::Uint(4), "MPI_UNSIGNED";
    LONG = 9, 8, Kind::Int(8), "MPI_LONG";
    UNSIGNED_LONG = 10, 8, Kind::Uint(8), "MPI_UNSIGNED_LONG";
    LONG_LONG = 11, 8, Kind::Int(8), "MPI_LONG_LONG";
    UNSIGNED_LONG_LONG = 12, 8, Kind::Uint(8), "MPI_UNSIGNED_LONG_LONG";
    FLOAT = 13, 4, Kind::F32, "MPI_FLOAT";
    DOUBLE = 14, 8, Kind::F64, "MPI_DOUBLE";
    C_BOOL = 15, 1, Kind::Bool, "MPI_C_BOOL";
    INT8_T = 16, 1, Kind::Int(1), "MPI_INT8_T";
    INT16_T = 17, 2, Kind::Int(2), "MPI_INT16_T";
    INT32_T = 18, 4, Kind::Int(4), "MPI_INT32_T";
    INT64_T = 19, 8, Kind::Int(8), "MPI_INT64_T";
    UINT8_T = 20, 1, Kind::Uint(1), "MPI_UINT8_T";
    UINT16_T = 21, 2, Kind::Uint(2), "MPI_UINT16_T";
    UINT32_T = 22, 4, Kind::Uint(4), "MPI_UINT32_T";
    UINT64_T = 23, 8, Kind::Uint(8), "MPI_UINT64_T";
    FLOAT_INT = 24, 8, Kind::Pair(PairValue::F32, 4), "MPI_FLOAT_INT";
    DOUBLE_INT = 25, 16, Kind::Pair(PairValue::F64, 8), "MPI_DOUBLE_INT";
    LONG_INT = 26, 16, Kind::Pair(PairValue::I64, 8), "MPI_LONG_INT";
    TWO_INT = 27, 8, Kind::Pair(PairValue::I32, 4), "MPI_2INT";
    SHORT_INT = 28, 8, Kind::Pair(PairValue::I16, 4), "MPI_SHORT_INT";
    LONG_DOUBLE = 29, 16, Kind::Opaque, "MPI_LONG_DOUBLE";
    WCHAR = 30, 4, Kind::Int(4), "MPI_WCHAR";
    PACKED = 31, 1, Kind::Byte, "MPI_PACKED";
}

impl Datatype {
    /// The datatype of handle value `id`.
    ///
    /// # Errors
    /// `Type` for an unknown value (`MPI_DATATYPE_NULL` included).
    pub fn from_id(id: i32) -> Result<Datatype> {
        // Handles are 1, 2, .. in the order of `ALL` (checked by a test).
        usize::try_from(id)
            .ok()
            .and_then(|i| ALL.get(i.wrapping_sub(1)))
            .copied()
            .ok_or(Error::Type)
    }

    /// Bytes of `count` elements.
    ///
    /// # Errors
    /// `Count` for a negative count or an overflow.
    pub fn bytes(&self, count: i32) -> Result<usize> {
        usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(self.size))
            .ok_or_else(|| Error::Count(format!("{count} elements of {}", self.name)))
    }
}

/// Rust element types with a predefined datatype.
pub trait Element: bytemuck::Pod {
    /// The datatype.
    const DATATYPE: Datatype;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(impl Element for $t { const DATATYPE: Datatype = $d; })*};
}
element!(i8 => INT8_T, u8 => UINT8_T, i16 => INT16_T, u16 => UINT16_T, i32 => INT32_T,
    u32 => UINT32_T, i64 => INT64_T, u64 => UINT64_T, f32 => FLOAT, f64 => DOUBLE);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_index_the_table() {
        for (i, d) in ALL.iter().enumerate() {
            assert_eq!(d.id as usize, i + 1, "{}", d.name);
            assert_eq!(Datatype::from_id(d.id).unwrap(), *d);
        }
        for bad in [0, -1, i32::MIN, ALL.len() as i32 + 1, i32::MAX] {
            assert!(Datatype::from_id(bad).is_err(), "{bad}");
        }
    }
}
