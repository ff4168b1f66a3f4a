//! Times and sizes as profilers write them.
//!
//! Kineto writes timestamps as JSON numbers of microseconds since the epoch (16 digits), torch_npu
//! as decimal strings with nanosecond fractions (`"1713174287407957.250"`), the Ascend CSVs as
//! decimal text. An `f64` holds 16-digit microseconds but not their nanosecond fractions, so every
//! form is parsed here as exact decimal text into integer nanoseconds.

use serde_json::Value;

/// Most significant digits a time may have (u128 holds 38).
const MAX_DIGITS: usize = 36;

/// Microseconds: 10^3 ns.
pub(crate) const US: i32 = 3;
/// Milliseconds: 10^6 ns.
pub(crate) const MS: i32 = 6;

/// A non-negative decimal number of units of 10^`unit` ns (`US`, `MS`) as integer nanoseconds,
/// rounded half up. Accepts `123`, `123.456`, `1.5e3`; refuses signs, NaN, infinity and values
/// beyond the u64 nanosecond clock, saying why.
pub(crate) fn decimal_ns(text: &str, unit: i32) -> Result<u64, &'static str> {
    let t = text.trim();
    let (negative, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let ns = magnitude_ns(t, unit)?;
    if negative && ns > 0 {
        return Err("must not be negative");
    }
    Ok(ns)
}

fn magnitude_ns(t: &str, unit: i32) -> Result<u64, &'static str> {
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(i) => {
            let e: i32 = t[i + 1..]
                .parse()
                .map_err(|_| "expected a decimal number")?;
            (&t[..i], e)
        }
        None => (t, 0),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((a, b)) => (a, b),
        None => (mantissa, ""),
    };
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|c| c.is_ascii_digit())
        || !frac.bytes().all(|c| c.is_ascii_digit())
    {
        return Err("expected a decimal number");
    }
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > MAX_DIGITS {
        return Err("has more digits than a time can");
    }
    let mut m: u128 = 0;
    for c in digits.bytes() {
        m = m * 10 + u128::from(c - b'0');
    }
    // value = m * 10^(exp - frac_len) units = m * 10^(unit + exp - frac_len) ns.
    let scale = i64::from(unit) + i64::from(exp) - frac.len() as i64;
    let ns = if m == 0 {
        0
    } else if scale >= 0 {
        let p = u32::try_from(scale)
            .ok()
            .and_then(|s| 10u128.checked_pow(s));
        p.and_then(|p| m.checked_mul(p))
            .ok_or("is beyond the u64 nanosecond clock")?
    } else {
        match u32::try_from(-scale)
            .ok()
            .and_then(|s| 10u128.checked_pow(s))
        {
            Some(p) => (m + p / 2) / p,
            None => 0,
        }
    };
    u64::try_from(ns).map_err(|_| "is beyond the u64 nanosecond clock")
}

/// A JSON number or decimal string of units of 10^`unit` ns as integer nanoseconds.
pub(crate) fn value_ns(v: &Value, unit: i32) -> Result<u64, &'static str> {
    match v {
        Value::Number(n) => decimal_ns(&n.to_string(), unit),
        Value::String(s) => decimal_ns(s, unit),
        _ => Err("expected a number"),
    }
}

/// A count from a JSON number or a decimal string: a whole number >= 0.
pub(crate) fn value_count(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A finite number >= 0 from a JSON number or a decimal string.
pub(crate) fn value_amount(v: &Value) -> Option<f64> {
    let x = match v {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    (x.is_finite() && x >= 0.0).then_some(x)
}

/// What kind of number a tensor element is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumberKind {
    Float,
    /// bfloat16: a float with float32's exponent.
    BFloat,
    Int,
}

/// A tensor element type: kind and width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElemType {
    pub kind: NumberKind,
    pub bits: u32,
}

impl ElemType {
    pub fn bytes(self) -> f64 {
        f64::from(self.bits) / 8.0
    }
}

/// An element type as profilers name it: PyTorch (`BFloat16`, `c10::Half`, `Float8_e4m3fn`),
/// CANN (`DT_BF16`, `FLOAT16`, `INT8`) or short forms (`bf16`, `f32`, `fp8`, `i8`). `None` for names it does
/// not know.
pub fn elem_type(name: &str) -> Option<ElemType> {
    use NumberKind::{BFloat, Float, Int};
    let n = name.trim().trim_matches('"');
    let n = n.strip_prefix("c10::").unwrap_or(n);
    let n = n.strip_prefix("torch.").unwrap_or(n);
    let upper = n.to_ascii_uppercase();
    let u = upper.strip_prefix("DT_").unwrap_or(&upper);
    let (kind, bits) = match u {
        "DOUBLE" | "FLOAT64" | "FP64" | "F64" => (Float, 64),
        "INT64" | "UINT64" | "LONG" | "I64" | "U64" => (Int, 64),
        "FLOAT" | "FLOAT32" | "FP32" | "F32" => (Float, 32),
        "INT32" | "UINT32" | "INT" | "I32" | "U32" => (Int, 32),
        "FLOAT16" | "FP16" | "HALF" | "F16" => (Float, 16),
        "BF16" | "BFLOAT16" => (BFloat, 16),
        "INT16" | "UINT16" | "SHORT" | "I16" | "U16" => (Int, 16),
        "INT8" | "UINT8" | "BYTE" | "CHAR" | "BOOL" | "I8" | "U8" => (Int, 8),
        "HIFLOAT8" => (Float, 8),
        "INT4" | "UINT4" => (Int, 4),
        _ if u.starts_with("FLOAT8") || u.starts_with("FP8") => (Float, 8),
        _ if u.starts_with("FLOAT4") || u.starts_with("FP4") => (Float, 4),
        _ => return None,
    };
    Some(ElemType { kind, bits })
}

/// Bytes per element of a data type as profilers name it ([`elem_type`]).
pub fn dtype_bytes(name: &str) -> Option<f64> {
    elem_type(name).map(ElemType::bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_times_are_exact_nanoseconds() {
        assert_eq!(
            decimal_ns("1740461679471346", US),
            Ok(1_740_461_679_471_346_000)
        );
        assert_eq!(
            decimal_ns("1713174287407957.250", US),
            Ok(1_713_174_287_407_957_250)
        );
        assert_eq!(decimal_ns("0.0005", US), Ok(1)); // half a ns rounds up
        assert_eq!(decimal_ns("2.9042", MS), Ok(2_904_200));
        assert_eq!(decimal_ns("1.5e3", US), Ok(1_500_000));
        assert_eq!(decimal_ns("-0.0", US), Ok(0));
        assert_eq!(decimal_ns("0", US), Ok(0));
        assert!(decimal_ns("-1", US).is_err());
        assert!(decimal_ns("nan", US).is_err());
        assert!(decimal_ns("inf", US).is_err());
        assert!(decimal_ns("", US).is_err());
        assert!(decimal_ns(".", US).is_err());
        assert!(decimal_ns("1e308", US).is_err());
        assert!(decimal_ns("18446744073709551616", US).is_err());
        assert_eq!(decimal_ns("1e-300", US), Ok(0));
    }

    #[test]
    fn data_types_of_both_profilers_have_sizes() {
        for (n, b) in [
            ("BFloat16", 2.0),
            ("c10::Half", 2.0),
            ("Float", 4.0),
            ("Float8_e4m3fn", 1.0),
            ("DT_BF16", 2.0),
            ("FLOAT16", 2.0),
            ("INT8", 1.0),
            ("int4", 0.5),
            ("Long", 8.0),
        ] {
            assert_eq!(dtype_bytes(n), Some(b), "{n}");
        }
        assert_eq!(dtype_bytes("Quaternion"), None);
    }
}
