//! CRC32C of concatenations from the CRCs of their parts, without reading the bytes again.
//!
//! A batch's CRC is computed once, when it enters the engine; the WAL entry and the data object
//! frame that later hold the batch extend their own CRC over it with [`chain`], which costs a
//! few hundred nanoseconds instead of a pass over the batch (≈ 4 µs per 64 KiB here). The bytes
//! on storage are the same as with a direct computation.
//!
//! Math: for CRC32C (reflected, initial value and final xor all ones), `crc(A ‖ B)` is
//! `crc(A) · x^(8·|B|) + crc(B)` modulo the polynomial; `x^(8n)` is the product of the
//! precomputed `x^(2^k)` for the set bits of `8n`.

/// The CRC32C polynomial, bit-reflected (bit 31 is the coefficient of `x^0`).
const POLY: u32 = 0x82F6_3B78;

/// Below this many bytes a direct pass is as cheap as combining (measured: 64 KiB combine
/// 0.24 µs, 4 KiB direct 0.23 µs).
pub const COMBINE_MIN: usize = 8 << 10;

/// `a · b` modulo the polynomial, both reflected.
const fn mul(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = 1u32 << 31;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        // b · x: reflected, a right shift; the x^32 term that leaves folds back as POLY.
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        bit >>= 1;
    }
    product
}

/// `X2K[k]` = `x^(2^k)` modulo the polynomial.
const X2K: [u32; 64] = {
    let mut t = [0u32; 64];
    t[0] = 1 << 30; // x^1
    let mut k = 1;
    while k < 64 {
        t[k] = mul(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// The CRC32C of `A ‖ B` from `crc1 = crc32c(A)`, `crc2 = crc32c(B)` and `len2 = |B|`.
pub fn combine(crc1: u32, crc2: u32, len2: usize) -> u32 {
    // x^(8·len2): bit i of len2 is bit i + 3 of 8·len2.
    let mut shift = 1u32 << 31; // x^0
    let mut n = len2 as u64;
    let mut k = 3;
    while n != 0 {
        if n & 1 != 0 {
            shift = mul(X2K[k], shift);
        }
        n >>= 1;
        k += 1;
    }
    mul(shift, crc1) ^ crc2
}

/// `crc32c_append(crc, data)` given `data_crc = crc32c(data)`: combined for large `data`, a
/// direct pass for small.
pub fn chain(crc: u32, data: &[u8], data_crc: u32) -> u32 {
    debug_assert_eq!(
        data_crc,
        crc32c::crc32c(data),
        "a carried CRC must match its bytes"
    );
    if data.len() >= COMBINE_MIN {
        combine(crc, data_crc, data.len())
    } else {
        crc32c::crc32c_append(crc, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn combine_equals_the_crc_of_the_concatenation(
            a in proptest::collection::vec(any::<u8>(), 0..3000),
            b in proptest::collection::vec(any::<u8>(), 0..40000),
        ) {
            let whole = [&a[..], &b[..]].concat();
            prop_assert_eq!(
                combine(crc32c::crc32c(&a), crc32c::crc32c(&b), b.len()),
                crc32c::crc32c(&whole)
            );
            let seed = crc32c::crc32c(&a);
            prop_assert_eq!(chain(seed, &b, crc32c::crc32c(&b)), crc32c::crc32c_append(seed, &b));
        }
    }

    #[test]
    fn combine_handles_empty_and_long_parts() {
        let a = b"picomq";
        assert_eq!(
            combine(crc32c::crc32c(a), crc32c::crc32c(b""), 0),
            crc32c::crc32c(a)
        );
        assert_eq!(combine(0, crc32c::crc32c(a), a.len()), crc32c::crc32c(a));
        // Lengths whose high bits are set use the far end of the table.
        let long = vec![0xA5u8; (1 << 20) + 12_345];
        let whole = [&a[..], &long[..]].concat();
        assert_eq!(
            combine(crc32c::crc32c(a), crc32c::crc32c(&long), long.len()),
            crc32c::crc32c(&whole)
        );
    }
}
