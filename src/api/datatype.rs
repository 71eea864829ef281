//! Typed data: plain-old-data element types and reduction operations.
//!
//! Slices of [`Equivalence`] types travel as raw bytes (no serialisation), the
//! way MPI's predefined datatypes do; structured values go through serde (see
//! `Communicator::send_value`). Reductions are applied element by element in a
//! fixed order chosen by the collective algorithm, so results are
//! bit-reproducible for a given rank count (DESIGN principle 5).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The element type of a buffer, as carried in RMA operations and reductions.
///
/// A user type ([`Equivalence`] for a plain struct) names the basic type of
/// its fields, as an MPI derived datatype built from one basic type does:
/// reductions and accumulates act on each field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DType {
    /// `u8`
    U8,
    /// `i32`
    I32,
    /// `u32`
    U32,
    /// `i64` (and `isize` on 64-bit machines)
    I64,
    /// `u64` (and `usize` on 64-bit machines)
    U64,
    /// `f32`
    F32,
    /// `f64`
    F64,
    /// `i8`
    I8,
    /// `i16`
    I16,
    /// `u16`
    U16,
    /// `i128`
    I128,
    /// `u128`
    U128,
    /// `bool` (one byte, 0 or 1, as MPI's `MPI_C_BOOL`)
    Bool,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 | DType::Bool => 1,
            DType::I16 | DType::U16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
            DType::I128 | DType::U128 => 16,
        }
    }
}

/// A reduction or accumulate operation (MPI_Op).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Bitwise and (integers only).
    BitAnd,
    /// Bitwise or (integers only).
    BitOr,
    /// Bitwise xor (integers only).
    BitXor,
    /// Replace the target with the operand (MPI_REPLACE, for accumulate).
    Replace,
    /// Leave the target unchanged (MPI_NO_OP, for get_accumulate/fetch_and_op).
    NoOp,
}

/// Element types that can be sent as raw bytes and reduced (rsmpi calls
/// this `Equivalence`, after MPI's predefined datatypes).
///
/// Implemented for every primitive integer and float type and `bool`. A
/// plain struct whose fields all have one basic type implements it in one
/// line, with the derives of the `bytemuck` crate (feature `derive`): its
/// reductions and accumulates act field by field, as MPI's do on a derived
/// datatype of one basic type.
///
/// ```
/// use bytemuck::{Pod, Zeroable};
/// use lazarus::{Config, DType, Equivalence, ReduceOp};
/// use serde::{Deserialize, Serialize};
///
/// // (Serialize and Deserialize only because ranks return it from the job.)
/// #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable, Serialize, Deserialize)]
/// #[repr(C)]
/// struct Moments { count: f64, sum: f64, sum_sq: f64 }
///
/// impl Equivalence for Moments {
///     const DTYPE: DType = DType::F64;
/// }
///
/// let report = lazarus::run(&Config::new(3), |ctx| {
///     let x = ctx.rank() as f64;
///     let mine = Moments { count: 1.0, sum: x, sum_sq: x * x };
///     ctx.world().all_reduce(mine, ReduceOp::Sum)
/// });
/// let all = Moments { count: 3.0, sum: 3.0, sum_sq: 5.0 };
/// assert_eq!(report.outcome.unwrap(), vec![all; 3]);
/// ```
///
/// Received bytes are checked before they become a `T`: bytes that are not
/// a valid value (a `bool` byte other than 0 or 1) are an error, never
/// undefined behaviour.
pub trait Equivalence:
    bytemuck::NoUninit
    + bytemuck::CheckedBitPattern
    + bytemuck::Zeroable
    + PartialEq
    + Send
    + Sync
    + 'static
{
    /// The element type tag: the type itself for a basic type, the type of
    /// every field for a struct.
    const DTYPE: DType;

    /// Combine `self` (the accumulator, left operand) with `x`.
    ///
    /// The default treats `Self` as an array of [`Self::DTYPE`] elements
    /// and combines them one by one (MPI's rule for a derived datatype);
    /// the size of `Self` must be a multiple of that type's size.
    fn combine(self, x: Self, op: ReduceOp) -> Self {
        combine_as_elements(self, x, op)
    }
}

/// [`Equivalence::combine`] for a type made of `T::DTYPE` elements: combine
/// its bytes element by element and read the result back. A result that is
/// not a valid `T` (a struct that mixes field types, which this rule does
/// not describe) leaves `acc` as it was.
fn combine_as_elements<T: Equivalence>(acc: T, x: T, op: ReduceOp) -> T {
    const {
        assert!(
            std::mem::size_of::<T>().is_multiple_of(T::DTYPE.size()),
            "the size of an Equivalence type must be a multiple of its DTYPE's size"
        )
    };
    let n = std::mem::size_of::<T>();
    let mut stack = [0u8; 256];
    let mut heap = Vec::new();
    let buf: &mut [u8] = if n <= stack.len() {
        &mut stack[..n]
    } else {
        heap.resize(n, 0);
        &mut heap
    };
    buf.copy_from_slice(bytemuck::bytes_of(&acc));
    combine_bytes(T::DTYPE, op, buf, bytemuck::bytes_of(&x));
    bytemuck::checked::try_pod_read_unaligned(buf).unwrap_or(acc)
}

macro_rules! int_equivalence {
    ($($t:ty => $d:ident),*) => {$(
        impl Equivalence for $t {
            const DTYPE: DType = DType::$d;
            fn combine(self, x: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => self.wrapping_add(x),
                    ReduceOp::Prod => self.wrapping_mul(x),
                    ReduceOp::Min => self.min(x),
                    ReduceOp::Max => self.max(x),
                    ReduceOp::BitAnd => self & x,
                    ReduceOp::BitOr => self | x,
                    ReduceOp::BitXor => self ^ x,
                    ReduceOp::Replace => x,
                    ReduceOp::NoOp => self,
                }
            }
        }
    )*};
}
int_equivalence!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, i32 => I32, u32 => U32,
    i64 => I64, u64 => U64, i128 => I128, u128 => U128
);
#[cfg(target_pointer_width = "64")]
int_equivalence!(usize => U64, isize => I64);
#[cfg(target_pointer_width = "32")]
int_equivalence!(usize => U32, isize => I32);

macro_rules! float_equivalence {
    ($($t:ty => $d:ident),*) => {$(
        impl Equivalence for $t {
            const DTYPE: DType = DType::$d;
            fn combine(self, x: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => self + x,
                    ReduceOp::Prod => self * x,
                    ReduceOp::Min => self.min(x),
                    ReduceOp::Max => self.max(x),
                    // Bitwise operations on floats act on the bit patterns.
                    ReduceOp::BitAnd => <$t>::from_bits(self.to_bits() & x.to_bits()),
                    ReduceOp::BitOr => <$t>::from_bits(self.to_bits() | x.to_bits()),
                    ReduceOp::BitXor => <$t>::from_bits(self.to_bits() ^ x.to_bits()),
                    ReduceOp::Replace => x,
                    ReduceOp::NoOp => self,
                }
            }
        }
    )*};
}
float_equivalence!(f32 => F32, f64 => F64);

/// Logical operations, with `false < true`: `Min` and `Prod` are "and",
/// `Max` is "or", and `Sum` is "or" too (a count that saturates at one: "did
/// any rank say yes"), where MPI has `MPI_LAND`, `MPI_LOR` and `MPI_LXOR`.
impl Equivalence for bool {
    const DTYPE: DType = DType::Bool;
    fn combine(self, x: Self, op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::BitOr => self | x,
            ReduceOp::Prod | ReduceOp::Min | ReduceOp::BitAnd => self & x,
            ReduceOp::BitXor => self ^ x,
            ReduceOp::Replace => x,
            ReduceOp::NoOp => self,
        }
    }
}

/// Why bytes cannot be read as elements of a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// Not a whole number of elements.
    Ragged,
    /// A whole number, but some element's bytes are not a valid value.
    InvalidValue,
}

impl Unreadable {
    /// The error a receive of `got` bytes as `T`s reports (`what`: which
    /// operation).
    pub(crate) fn error<T: Equivalence>(self, got: usize, what: &str) -> crate::Error {
        match self {
            Unreadable::Ragged => crate::Error::SizeMismatch {
                expected: std::mem::size_of::<T>(),
                got,
                what: format!(
                    "{what}: not a whole number of {}-byte elements",
                    size_of::<T>()
                )
                .into(),
            },
            Unreadable::InvalidValue => crate::Error::Codec {
                what: what.to_string().into(),
                detail: format!(
                    "bytes that are not a valid `{}`",
                    std::any::type_name::<T>()
                ),
            },
        }
    }
}

/// Copy a byte buffer (any alignment) into a typed vector; `None` if it is
/// not a whole number of valid elements.
pub fn to_vec<T: Equivalence>(bytes: &[u8]) -> Option<Vec<T>> {
    read_vec(bytes).ok()
}

/// [`to_vec`], saying why not.
pub(crate) fn read_vec<T: Equivalence>(bytes: &[u8]) -> Result<Vec<T>, Unreadable> {
    let size = std::mem::size_of::<T>();
    if size == 0 || !bytes.len().is_multiple_of(size) {
        return Err(Unreadable::Ragged);
    }
    let mut v = Vec::with_capacity(bytes.len() / size);
    extend_from_bytes(&mut v, bytes)?;
    Ok(v)
}

/// Append the elements whose bytes are `bytes` (a whole number of them)
/// to `out`: one copy, without zeroing the new elements first (as
/// `vec![0; n]` then a copy would: a memset of every received vector).
/// The validity check compiles to nothing for types whose every bit
/// pattern is valid.
pub(crate) fn extend_from_bytes<T: Equivalence>(
    out: &mut Vec<T>,
    bytes: &[u8],
) -> Result<(), Unreadable> {
    use bytemuck::checked::{CheckedCastError, try_cast_slice, try_pod_read_unaligned};
    match try_cast_slice::<u8, T>(bytes) {
        Ok(aligned) => out.extend_from_slice(aligned),
        Err(CheckedCastError::InvalidBitPattern) => return Err(Unreadable::InvalidValue),
        // A buffer not aligned for `T` (a slice of a frame at an odd offset).
        Err(CheckedCastError::PodCastError(_)) => {
            let size = std::mem::size_of::<T>();
            if size == 0 || !bytes.len().is_multiple_of(size) {
                return Err(Unreadable::Ragged);
            }
            out.reserve(bytes.len() / size);
            for chunk in bytes.chunks_exact(size) {
                out.push(try_pod_read_unaligned(chunk).map_err(|_| Unreadable::InvalidValue)?);
            }
        }
    }
    Ok(())
}

/// Copy `src` into the front of `dst` (which must hold at least as many
/// elements), checking each element's bytes.
pub(crate) fn copy_from_bytes<T: Equivalence>(src: &[u8], dst: &mut [T]) -> Result<(), Unreadable> {
    use bytemuck::checked::{CheckedCastError, try_cast_slice, try_pod_read_unaligned};
    let size = std::mem::size_of::<T>();
    if size == 0 || !src.len().is_multiple_of(size) || src.len() / size > dst.len() {
        return Err(Unreadable::Ragged);
    }
    match try_cast_slice::<u8, T>(src) {
        Ok(aligned) => dst[..aligned.len()].copy_from_slice(aligned),
        Err(CheckedCastError::InvalidBitPattern) => return Err(Unreadable::InvalidValue),
        Err(CheckedCastError::PodCastError(_)) => {
            for (d, chunk) in dst.iter_mut().zip(src.chunks_exact(size)) {
                *d = try_pod_read_unaligned(chunk).map_err(|_| Unreadable::InvalidValue)?;
            }
        }
    }
    Ok(())
}

/// Turn an owned vector into a shared immutable buffer without copying it.
pub fn vec_into_bytes<T: Equivalence>(v: Vec<T>) -> Bytes {
    struct Owner<T>(Vec<T>);
    impl<T: bytemuck::NoUninit> AsRef<[u8]> for Owner<T> {
        fn as_ref(&self) -> &[u8] {
            bytemuck::cast_slice(&self.0)
        }
    }
    Bytes::from_owner(Owner(v))
}

/// Copy a slice into a new shared buffer (the one copy a send makes when the
/// caller keeps its buffer, as MPI's eager protocol does).
pub fn slice_to_bytes<T: Equivalence>(s: &[T]) -> Bytes {
    Bytes::copy_from_slice(bytemuck::cast_slice(s))
}

/// Apply `op` element-wise: `acc[i] = acc[i] op x[i]`, on raw little-endian
/// bytes of type `dtype`. Used by RMA accumulate on window memory.
pub fn combine_bytes(dtype: DType, op: ReduceOp, acc: &mut [u8], x: &[u8]) {
    fn go<T: Equivalence + bytemuck::Pod>(op: ReduceOp, acc: &mut [u8], x: &[u8]) {
        let n = std::mem::size_of::<T>();
        for (a, b) in acc.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
            let va: T = bytemuck::pod_read_unaligned(a);
            let vb: T = bytemuck::pod_read_unaligned(b);
            a.copy_from_slice(bytemuck::bytes_of(&va.combine(vb, op)));
        }
    }
    match dtype {
        DType::U8 => go::<u8>(op, acc, x),
        DType::I8 => go::<i8>(op, acc, x),
        DType::U16 => go::<u16>(op, acc, x),
        DType::I16 => go::<i16>(op, acc, x),
        DType::I32 => go::<i32>(op, acc, x),
        DType::U32 => go::<u32>(op, acc, x),
        DType::I64 => go::<i64>(op, acc, x),
        DType::U64 => go::<u64>(op, acc, x),
        DType::I128 => go::<i128>(op, acc, x),
        DType::U128 => go::<u128>(op, acc, x),
        DType::F32 => go::<f32>(op, acc, x),
        DType::F64 => go::<f64>(op, acc, x),
        // Window bytes and operands come from other ranks: any nonzero
        // byte reads as `true`, and the result is always 0 or 1.
        DType::Bool => {
            for (a, b) in acc.iter_mut().zip(x) {
                *a = u8::from((*a != 0).combine(*b != 0, op));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_bytes_matches_typed_combine() {
        let mut acc = slice_to_bytes(&[1.5f64, -2.0]).to_vec();
        let x = slice_to_bytes(&[0.25f64, 4.0]);
        combine_bytes(DType::F64, ReduceOp::Sum, &mut acc, &x);
        assert_eq!(to_vec::<f64>(&acc), Some(vec![1.75, 2.0]));
        let mut acc = slice_to_bytes(&[7u64]).to_vec();
        combine_bytes(
            DType::U64,
            ReduceOp::Max,
            &mut acc,
            &slice_to_bytes(&[9u64]),
        );
        assert_eq!(to_vec::<u64>(&acc), Some(vec![9]));
    }

    #[test]
    fn vec_into_bytes_does_not_copy() {
        let v = vec![3u64; 1024];
        let ptr = v.as_ptr() as *const u8;
        let b = vec_into_bytes(v);
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(to_vec::<u64>(&b).map(|v| v.len()), Some(1024));
    }

    #[test]
    fn to_vec_rejects_ragged_lengths() {
        assert!(to_vec::<u32>(&[1, 2, 3]).is_none());
    }

    /// Bytes that are no `bool` are refused on every path (aligned or not,
    /// into a vector or a buffer); accumulating on them reads any nonzero
    /// byte as `true` and writes only 0 or 1.
    #[test]
    fn bool_bytes_are_checked_and_accumulate_stays_valid() {
        assert_eq!(to_vec::<bool>(&[0, 1, 1]), Some(vec![false, true, true]));
        assert_eq!(read_vec::<bool>(&[0, 2]), Err(Unreadable::InvalidValue));
        let mut buf = [false; 4];
        assert_eq!(
            copy_from_bytes(&[1, 255], &mut buf),
            Err(Unreadable::InvalidValue)
        );
        assert_eq!(copy_from_bytes(&[1, 0, 1], &mut buf), Ok(()));
        assert_eq!(buf, [true, false, true, false]);
        assert_eq!(copy_from_bytes(&[1; 5], &mut buf), Err(Unreadable::Ragged));
        let mut acc = vec![0u8, 7, 1, 0];
        combine_bytes(DType::Bool, ReduceOp::BitXor, &mut acc, &[9, 1, 0, 0]);
        assert_eq!(acc, vec![1, 0, 1, 0]);
        // Unaligned u64s from a frame at an odd offset.
        let bytes = slice_to_bytes(&[5u64, 6]);
        let mut odd = vec![0u8];
        odd.extend_from_slice(&bytes);
        assert_eq!(read_vec::<u64>(&odd[1..]), Ok(vec![5, 6]));
        let mut two = [0u64; 2];
        assert_eq!(copy_from_bytes(&odd[1..], &mut two), Ok(()));
        assert_eq!(two, [5, 6]);
    }

    /// The default `combine` of a struct acts field by field; the sizes
    /// and types added beyond MPI's classic ones reduce like Rust's.
    #[test]
    fn struct_and_wide_types_combine_element_by_element() {
        #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(C)]
        struct P {
            a: i16,
            b: i16,
        }
        impl Equivalence for P {
            const DTYPE: DType = DType::I16;
        }
        let x = P { a: 3, b: -7 };
        let y = P { a: -5, b: 2 };
        assert_eq!(x.combine(y, ReduceOp::Sum), P { a: -2, b: -5 });
        assert_eq!(x.combine(y, ReduceOp::Max), P { a: 3, b: 2 });
        assert_eq!(x.combine(y, ReduceOp::Replace), y);
        assert_eq!(u128::MAX.combine(2, ReduceOp::Sum), 1);
        assert_eq!(usize::DTYPE.size(), std::mem::size_of::<usize>());
        assert!(true.combine(false, ReduceOp::Sum));
        assert!(!true.combine(false, ReduceOp::Min));
    }
}

/// Serde adapter for a `Vec<T>` of an [`Equivalence`] type in a checkpoint:
/// the elements are written as one block of bytes (a copy at memory speed)
/// instead of one at a time, which is what serde does for a `Vec<f64>` and
/// what dominates checkpointing a large numeric state.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct State {
///     iteration: u64,
///     #[serde(with = "lazarus::bulk")]
///     field: Vec<f64>,
/// }
/// let s = State { iteration: 3, field: vec![0.5; 1000] };
/// let bytes = postcard::to_allocvec(&s).unwrap();
/// let back: State = postcard::from_bytes(&bytes).unwrap();
/// assert_eq!(back.field, s.field);
/// ```
///
/// The bytes are in the machine's byte order: a piece is restored by the
/// same program on machines of the same architecture (as messages between
/// ranks are). Formats without a byte-string type (JSON) get a sequence of
/// byte values, which reads back too.
pub mod bulk {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{self, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    use super::{Equivalence, to_vec};

    /// Write `v` as one byte string.
    pub fn serialize<T: Equivalence, S: Serializer>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytemuck::cast_slice(v))
    }

    /// Read a byte string written by [`serialize`] (any alignment).
    pub fn deserialize<'de, T: Equivalence, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<T>, D::Error> {
        d.deserialize_bytes(Elements(PhantomData))
    }

    struct Elements<T>(PhantomData<T>);

    impl<'de, T: Equivalence> Visitor<'de> for Elements<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "bytes of {}-byte elements",
                std::mem::size_of::<T>().max(1)
            )
        }

        fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<Vec<T>, E> {
            to_vec(b).ok_or_else(|| E::invalid_length(b.len(), &self))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut b = Vec::with_capacity(seq.size_hint().unwrap_or(0));
            while let Some(x) = seq.next_element::<u8>()? {
                b.push(x);
            }
            self.visit_bytes(&b)
        }
    }

    #[cfg(test)]
    mod tests {
        #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
        struct S {
            a: u8,
            #[serde(with = "super")]
            v: Vec<f64>,
            #[serde(with = "super")]
            w: Vec<u32>,
        }

        #[test]
        fn round_trips_in_postcard_and_json_at_any_alignment() {
            let s = S {
                a: 1,
                v: vec![1.5, -0.0, f64::MAX, f64::MIN_POSITIVE],
                w: vec![],
            };
            let p = postcard::to_allocvec(&s).expect("encodes");
            // One length byte and the raw elements.
            assert_eq!(p.len(), 1 + 1 + 32 + 1);
            assert_eq!(postcard::from_bytes::<S>(&p).expect("decodes"), s);
            let j = serde_json::to_string(&s).expect("encodes");
            assert_eq!(serde_json::from_str::<S>(&j).expect("decodes"), s);
        }

        #[test]
        fn a_length_that_is_no_multiple_of_the_element_is_an_error() {
            // a = 1, then 3 bytes where f64s are expected.
            let err = postcard::from_bytes::<S>(&[1, 3, 0, 0, 0, 0]).expect_err("refused");
            assert!(!err.to_string().is_empty());
        }
    }
}
