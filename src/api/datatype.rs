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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DType {
    /// `u8`
    U8,
    /// `i32`
    I32,
    /// `u32`
    U32,
    /// `i64`
    I64,
    /// `u64`
    U64,
    /// `f32`
    F32,
    /// `f64`
    F64,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
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

/// Element types that can be sent as raw bytes and reduced.
///
/// Implemented for the primitive integer and float types (rsmpi calls this
/// `Equivalence`).
pub trait Equivalence: bytemuck::Pod + PartialEq + Send + Sync + 'static {
    /// The element type tag.
    const DTYPE: DType;
    /// Combine `self` (the accumulator, left operand) with `x`.
    fn combine(self, x: Self, op: ReduceOp) -> Self;
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
int_equivalence!(u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64);

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

/// Copy a byte buffer (any alignment) into a typed vector.
pub fn to_vec<T: Equivalence>(bytes: &[u8]) -> Option<Vec<T>> {
    let size = std::mem::size_of::<T>();
    if size == 0 || !bytes.len().is_multiple_of(size) {
        return None;
    }
    let mut v = Vec::with_capacity(bytes.len() / size);
    extend_from_bytes(&mut v, bytes);
    Some(v)
}

/// Append the elements whose bytes are `bytes` (a whole number of them)
/// to `out`: one copy, without zeroing the new elements first (as
/// `vec![0; n]` then a copy would: a memset of every received vector).
pub(crate) fn extend_from_bytes<T: Equivalence>(out: &mut Vec<T>, bytes: &[u8]) {
    match bytemuck::try_cast_slice::<u8, T>(bytes) {
        Ok(aligned) => out.extend_from_slice(aligned),
        // A buffer not aligned for `T` (a slice of a frame at an odd offset).
        Err(_) => out.extend(
            bytes
                .chunks_exact(std::mem::size_of::<T>())
                .map(bytemuck::pod_read_unaligned::<T>),
        ),
    }
}

/// Turn an owned vector into a shared immutable buffer without copying it.
pub fn vec_into_bytes<T: Equivalence>(v: Vec<T>) -> Bytes {
    struct Owner<T>(Vec<T>);
    impl<T: bytemuck::Pod> AsRef<[u8]> for Owner<T> {
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
    fn go<T: Equivalence>(op: ReduceOp, acc: &mut [u8], x: &[u8]) {
        let n = std::mem::size_of::<T>();
        for (a, b) in acc.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
            let va: T = bytemuck::pod_read_unaligned(a);
            let vb: T = bytemuck::pod_read_unaligned(b);
            a.copy_from_slice(bytemuck::bytes_of(&va.combine(vb, op)));
        }
    }
    match dtype {
        DType::U8 => go::<u8>(op, acc, x),
        DType::I32 => go::<i32>(op, acc, x),
        DType::U32 => go::<u32>(op, acc, x),
        DType::I64 => go::<i64>(op, acc, x),
        DType::U64 => go::<u64>(op, acc, x),
        DType::F32 => go::<f32>(op, acc, x),
        DType::F64 => go::<f64>(op, acc, x),
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
