//! Kubernetes resource quantities (`500m`, `1.5`, `1Gi`, `1e3`, `129M`), parsed the way
//! apimachinery's `resource.ParseQuantity` accepts them and held exactly as a rational number,
//! so `Value()` / `MilliValue()` round up like Kubernetes does. Each keeps the format its text
//! was written in (`resource.Format`), and prints in Kubernetes' canonical form
//! (`Quantity.String()`: `1024Mi` prints as `1Gi`, `1000M` as `1G`, `0.5Ki` as `512`), as the
//! API server's and kubelet's messages do, so qosd's messages about requests, limits and
//! reservations read like theirs.
use std::fmt;

/// Errors parsing a quantity; always carries the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("quantity {0:?} is empty")]
    Empty(String),
    #[error("quantity {0:?} is not a number with an optional suffix (e.g. 500m, 1.5, 1Gi, 1e3)")]
    Malformed(String),
    #[error("quantity {0:?} has an unknown suffix")]
    UnknownSuffix(String),
    #[error("quantity {0:?} is out of range")]
    OutOfRange(String),
}

/// An exact quantity, in nano units, with the format it is written back in.
///
/// Ordering and equality are exact and ignore the format (`resource.Quantity.Cmp`):
/// `1` == `1000m`, `1Ki` == `1024`, and `0.5m` < `1m`.
#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    /// Value times 10^9 (nano units), which covers every decimal suffix down to `n`.
    nanos: i128,
    format: Format,
}

/// How a quantity is written back (`resource.Format`): the kind of suffix it was parsed with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Format {
    /// No suffix or a decimal one (`m`, `k`, `M`, ...).
    #[default]
    DecimalSI,
    /// A binary suffix (`Ki`, `Mi`, ...).
    BinarySI,
    /// An exponent (`1e3`, `5E-2`).
    DecimalExponent,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

const NANO: i128 = 1_000_000_000;
/// apimachinery's `maxAllowed`, 2^63-1 units, in nanos.
const MAX_NANOS: i128 = i64::MAX as i128 * NANO;

impl Quantity {
    /// Parses a quantity string.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let s = text.trim();
        if s.is_empty() {
            return Err(QuantityError::Empty(text.to_owned()));
        }
        let (negative, unsigned) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_end = unsigned
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(unsigned.len());
        let (number, suffix) = unsigned.split_at(number_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(QuantityError::Malformed(text.to_owned()));
        }
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        // Digits as an integer plus a decimal exponent: 1.25 -> 125e-2.
        let digits = format!("{whole}{fraction}");
        let digits = digits.trim_start_matches('0');
        // 30 significant digits fit an i128 with room for the suffix; the rest only round up
        // (exactly: nanoseconds lie on the 30-digit grid wherever the value is below the cap).
        let (kept, dropped) = digits.split_at(digits.len().min(30));
        let mut mantissa: i128 = if kept.is_empty() {
            0
        } else {
            kept.parse()
                .map_err(|_| QuantityError::Malformed(text.to_owned()))?
        };
        if dropped.bytes().any(|b| b != b'0') {
            mantissa += 1;
        }
        let mut exponent10 = i32::try_from(dropped.len())
            .ok()
            .zip(i32::try_from(fraction.len()).ok())
            .map(|(dropped, fraction)| dropped - fraction)
            .ok_or_else(|| QuantityError::OutOfRange(text.to_owned()))?;
        let mut binary_shift = 0u32;
        let mut format = Format::DecimalSI;
        match suffix {
            "" => {}
            "n" => exponent10 -= 9,
            "u" => exponent10 -= 6,
            "m" => exponent10 -= 3,
            "k" => exponent10 += 3,
            "M" => exponent10 += 6,
            "G" => exponent10 += 9,
            "T" => exponent10 += 12,
            "P" => exponent10 += 15,
            "E" => exponent10 += 18,
            "Ki" => binary_shift = 10,
            "Mi" => binary_shift = 20,
            "Gi" => binary_shift = 30,
            "Ti" => binary_shift = 40,
            "Pi" => binary_shift = 50,
            "Ei" => binary_shift = 60,
            other => {
                let Some(exp) = other.strip_prefix(['e', 'E']) else {
                    return Err(QuantityError::UnknownSuffix(text.to_owned()));
                };
                let exp: i32 = exp
                    .parse()
                    .map_err(|_| QuantityError::Malformed(text.to_owned()))?;
                exponent10 = exponent10
                    .checked_add(exp)
                    .ok_or_else(|| QuantityError::OutOfRange(text.to_owned()))?;
                format = Format::DecimalExponent;
            }
        }
        // nanos = mantissa * 2^binary_shift * 10^(exponent10 + 9), rounded up when precision is
        // lost. Like apimachinery's ParseQuantity, a binary-suffixed magnitude above 2^63-1
        // units is that (`maxAllowed`: `9Ei` is 9223372036854775807); a decimal one is kept
        // exactly (`12E`), up to what 128 bits of nanos hold (about 1.7e29 units, far past any
        // resource), and beyond that an error.
        let binary = binary_shift > 0;
        if binary {
            format = Format::BinarySI;
        }
        let shift = exponent10.saturating_add(9);
        let nanos = if shift >= 0 {
            match u32::try_from(shift)
                .ok()
                .and_then(|shift| 10i128.checked_pow(shift))
                .and_then(|factor| mantissa.checked_mul(1 << binary_shift)?.checked_mul(factor))
            {
                Some(nanos) => nanos,
                None if binary => MAX_NANOS,
                None => return Err(QuantityError::OutOfRange(text.to_owned())),
            }
        } else {
            scale_down(mantissa.unsigned_abs(), binary_shift, shift.unsigned_abs())
        };
        let nanos = if binary { nanos.min(MAX_NANOS) } else { nanos };
        // Less than one unit cannot be written with a binary suffix (ParseQuantity switches it
        // to DecimalSI: `0.000000000001Ki` is `2n`).
        if binary && nanos > 0 && nanos < NANO {
            format = Format::DecimalSI;
        }
        Ok(Self {
            nanos: if negative { -nanos } else { nanos },
            format,
        })
    }

    /// Zero.
    pub const ZERO: Self = Self {
        nanos: 0,
        format: Format::DecimalSI,
    };

    /// The exact sum, saturating at the representable range (`resource.Quantity.Add`: the
    /// format is the receiver's, or the other's when the receiver is zero).
    #[must_use]
    pub fn saturating_add(self, other: Self) -> Self {
        Self {
            nanos: self.nanos.saturating_add(other.nanos),
            format: if self.is_zero() {
                other.format
            } else {
                self.format
            },
        }
    }

    /// A quantity of whole units (`resource.NewQuantity(units, DecimalSI)`).
    #[must_use]
    pub fn from_units(units: i64) -> Self {
        Self {
            nanos: i128::from(units) * NANO,
            format: Format::DecimalSI,
        }
    }

    /// A quantity of thousandths, millicores for example
    /// (`resource.NewMilliQuantity(millis, DecimalSI)`).
    #[must_use]
    pub fn from_millis(millis: i64) -> Self {
        Self {
            nanos: i128::from(millis) * 1_000_000,
            format: Format::DecimalSI,
        }
    }

    /// The value in whole units, rounded up (`resource.Quantity.Value()`).
    #[must_use]
    pub fn value(&self) -> i64 {
        saturate(ceil_div(self.nanos, NANO))
    }

    /// The value in thousandths, rounded up (`resource.Quantity.MilliValue()`).
    #[must_use]
    pub fn milli_value(&self) -> i64 {
        saturate(ceil_div(self.nanos, 1_000_000))
    }

    /// True for zero.
    #[must_use]
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// True for negative quantities.
    #[must_use]
    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }
}

/// Kubernetes' canonical form (`Quantity.String()`, `CanonicalizeBytes`): zero is `0`; a
/// binary quantity is a whole number times the largest power of 1024 that divides it (`1Gi`,
/// `1536Mi`, `1025`), unless it is under 1024 in magnitude or not whole, which is written as
/// decimal; a decimal one is its digits without trailing zeros times a power of ten that is a
/// multiple of three, with that power's suffix (`n` to `E`; `e21` and beyond, which have no
/// suffix); an exponent one the same with `e<power>`.
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let magnitude = self.nanos.unsigned_abs();
        let nano = NANO.unsigned_abs();
        let binary = self.format == Format::BinarySI
            && magnitude >= 1024 * nano
            && magnitude.is_multiple_of(nano);
        if binary {
            let (mut units, mut power) = (magnitude / nano, 0);
            while units % 1024 == 0 && power + 1 < BINARY_SUFFIXES.len() {
                units /= 1024;
                power += 1;
            }
            return write!(f, "{sign}{units}{}", BINARY_SUFFIXES[power]);
        }
        // Removing the zeros and putting back at most two of them keeps it within `magnitude`.
        let (mut digits, mut exponent) = (magnitude, -9i32);
        while digits % 10 == 0 {
            digits /= 10;
            exponent += 1;
        }
        while exponent % 3 != 0 {
            digits *= 10;
            exponent -= 1;
        }
        let suffix = match (self.format, exponent) {
            (Format::DecimalExponent, 0) => String::new(),
            (Format::DecimalExponent, _) => format!("e{exponent}"),
            (_, -9) => "n".into(),
            (_, -6) => "u".into(),
            (_, -3) => "m".into(),
            (_, 0) => String::new(),
            (_, 3) => "k".into(),
            (_, 6) => "M".into(),
            (_, 9) => "G".into(),
            (_, 12) => "T".into(),
            (_, 15) => "P".into(),
            (_, 18) => "E".into(),
            (_, beyond) => format!("e{beyond}"),
        };
        write!(f, "{sign}{digits}{suffix}")
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl<'de> serde::Deserialize<'de> for Quantity {
    /// Accepts a string (`"500m"`) or a bare number (`2`, `0.5`), as Kubernetes does.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(i64),
            Float(f64),
        }
        let text = match Raw::deserialize(deserializer)? {
            Raw::Text(s) => s,
            Raw::Int(i) => i.to_string(),
            Raw::Float(x) => x.to_string(),
        };
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// `ceil(a * 2^binary_shift / 10^decimal_shift)`, exact for any `a` below 2^101, saturating
/// at [`MAX_NANOS`] (only a binary suffix can get there: below a nano, 30 decimal digits stay
/// far under it). The product can pass 128 bits (30 digits times `Ei`'s 2^60), so it is
/// divided bit by bit by at most 10^38, and by the rest of the power of ten afterwards
/// (`ceil(ceil(x / y) / z) == ceil(x / (y * z))` for positive integers).
fn scale_down(a: u128, binary_shift: u32, decimal_shift: u32) -> i128 {
    const CAP: u128 = MAX_NANOS.unsigned_abs();
    let first = decimal_shift.min(38);
    let divisor = 10u128.pow(first);
    let (mut quotient, mut remainder) = (0u128, 0u128);
    let bits = 128 - a.leading_zeros();
    for i in (0..bits + binary_shift).rev() {
        let bit = if i >= binary_shift {
            (a >> (i - binary_shift)) & 1
        } else {
            0
        };
        // remainder < divisor <= 10^38 < 2^127: doubling it cannot overflow.
        remainder = (remainder << 1) | bit;
        quotient <<= 1;
        if remainder >= divisor {
            remainder -= divisor;
            quotient |= 1;
        }
        if quotient > CAP {
            return MAX_NANOS;
        }
    }
    let mut value = quotient + u128::from(remainder != 0);
    let mut rest = decimal_shift - first;
    // A positive value rounds up to at least 1, and 1 stays 1: stop there (an exponent of
    // -2000000000 would otherwise take 50 million divisions; found by the fuzzer).
    while rest > 0 && value > 1 {
        let step = rest.min(38);
        value = value.div_ceil(10u128.pow(step));
        rest -= step;
    }
    i128::try_from(value.min(CAP)).unwrap_or(MAX_NANOS)
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && ((a > 0) == (b > 0)) {
        q + 1
    } else {
        q
    }
}

fn saturate(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v > 0 { i64::MAX } else { i64::MIN })
}

#[cfg(test)]
mod tests {
    use super::Format::{BinarySI, DecimalExponent, DecimalSI};
    use super::*;

    /// apimachinery's `TestQuantityParse` table (k8s.io/apimachinery, pkg/api/resource/
    /// quantity_test.go, master of 2026): the text, and the exact value its `decQuantity(m, e)`
    /// names, m * 10^e, rounded up to nanos as ParseQuantity does. Each row is also parsed with
    /// `-` and `+` in front, as that test does, and the format it expects. The two rows that
    /// saturate at `maxAllowed` (a cap ParseQuantity applies to binary suffixes only) follow,
    /// and then its invalid strings.
    const APIMACHINERY_PARSE: &[(&str, i128, i32, Format)] = &[
        ("0", 0, 0, DecimalSI),
        ("0n", 0, 0, DecimalSI),
        ("0u", 0, 0, DecimalSI),
        ("0m", 0, 0, DecimalSI),
        ("0Ki", 0, 0, BinarySI),
        ("0k", 0, 0, DecimalSI),
        ("0Mi", 0, 0, BinarySI),
        ("0M", 0, 0, DecimalSI),
        ("0Gi", 0, 0, BinarySI),
        ("0G", 0, 0, DecimalSI),
        ("0Ti", 0, 0, BinarySI),
        ("0T", 0, 0, DecimalSI),
        ("1", 1, 0, DecimalSI),
        ("1Ki", 1024, 0, BinarySI),
        ("8Ki", 8 * 1024, 0, BinarySI),
        ("7Mi", 7 << 20, 0, BinarySI),
        ("6Gi", 6 << 30, 0, BinarySI),
        ("5Ti", 5 << 40, 0, BinarySI),
        ("4Pi", 4 << 50, 0, BinarySI),
        ("3Ei", 3 << 60, 0, BinarySI),
        ("10Ti", 10 << 40, 0, BinarySI),
        ("100Ti", 100 << 40, 0, BinarySI),
        ("5n", 5, -9, DecimalSI),
        ("4u", 4, -6, DecimalSI),
        ("3m", 3, -3, DecimalSI),
        ("9", 9, 0, DecimalSI),
        ("8k", 8, 3, DecimalSI),
        ("50k", 5, 4, DecimalSI),
        ("7M", 7, 6, DecimalSI),
        ("6G", 6, 9, DecimalSI),
        ("5T", 5, 12, DecimalSI),
        ("40T", 4, 13, DecimalSI),
        ("300T", 3, 14, DecimalSI),
        ("2P", 2, 15, DecimalSI),
        ("1E", 1, 18, DecimalSI),
        ("1E-3", 1, -3, DecimalExponent),
        ("1e3", 1, 3, DecimalExponent),
        ("1E6", 1, 6, DecimalExponent),
        ("1e9", 1, 9, DecimalExponent),
        ("1E12", 1, 12, DecimalExponent),
        ("1e15", 1, 15, DecimalExponent),
        ("1E18", 1, 18, DecimalExponent),
        ("1e14", 1, 14, DecimalExponent),
        ("1e13", 1, 13, DecimalExponent),
        ("100.035k", 100_035, 0, DecimalSI),
        ("0.001", 1, -3, DecimalSI),
        ("0.0005k", 5, -1, DecimalSI),
        ("0.005", 5, -3, DecimalSI),
        ("0.05", 5, -2, DecimalSI),
        ("0.5", 5, -1, DecimalSI),
        ("0.00050k", 5, -1, DecimalSI),
        ("0.00500", 5, -3, DecimalSI),
        ("0.05000", 5, -2, DecimalSI),
        ("0.50000", 5, -1, DecimalSI),
        ("0.5e0", 5, -1, DecimalExponent),
        ("0.5e-1", 5, -2, DecimalExponent),
        ("0.5e-2", 5, -3, DecimalExponent),
        ("10.035M", 10035, 3, DecimalSI),
        ("1.2e3", 12, 2, DecimalExponent),
        ("1.3E+6", 13, 5, DecimalExponent),
        ("1.40e9", 14, 8, DecimalExponent),
        ("1.53E12", 153, 10, DecimalExponent),
        ("1.6e15", 16, 14, DecimalExponent),
        ("1.7E18", 17, 17, DecimalExponent),
        ("9.01", 901, -2, DecimalSI),
        ("8.1k", 81, 2, DecimalSI),
        ("7.123456M", 7_123_456, 0, DecimalSI),
        ("6.987654321G", 6_987_654_321, 0, DecimalSI),
        ("5.444T", 5444, 9, DecimalSI),
        ("40.1T", 401, 11, DecimalSI),
        ("300.2T", 3002, 11, DecimalSI),
        ("2.5P", 25, 14, DecimalSI),
        ("1.01E", 101, 16, DecimalSI),
        ("3.001n", 4, -9, DecimalSI),
        ("1.1E-9", 2, -9, DecimalExponent),
        ("0.0000000001", 1, -9, DecimalSI),
        ("0.0000000005", 1, -9, DecimalSI),
        ("0.00000000050", 1, -9, DecimalSI),
        ("0.5e-9", 1, -9, DecimalExponent),
        ("0.9n", 1, -9, DecimalSI),
        ("0.00000012345", 124, -9, DecimalSI),
        ("0.00000012354", 124, -9, DecimalSI),
        ("12E", 12, 18, DecimalSI),
        ("100.035Ki", 10_243_584, -2, BinarySI),
        ("0.5Mi", 524_288, 0, BinarySI),
        ("0.05Gi", 536_870_912, -1, BinarySI),
        ("0.025Ti", 274_877_906_944, -1, BinarySI),
        ("0.000000000001Ki", 2, -9, DecimalSI),
        (".001", 1, -3, DecimalSI),
        (".0001k", 100, -3, DecimalSI),
        ("1.", 1, 0, DecimalSI),
        ("1.G", 1, 9, DecimalSI),
    ];

    /// apimachinery's `TestQuantityString` table (same file): `decQuantity(m, e, format)`, the
    /// canonical text Kubernetes prints for it, and an alternate spelling that parses to the
    /// same canonical text ("" where the table has none).
    const APIMACHINERY_STRING: &[(i128, i32, Format, &str, &str)] = &[
        (1024 * 1024 * 1024, 0, BinarySI, "1Gi", "1024Mi"),
        (300 * 1024 * 1024, 0, BinarySI, "300Mi", "307200Ki"),
        (6 * 1024, 0, BinarySI, "6Ki", ""),
        (
            1001 * 1024 * 1024 * 1024,
            0,
            BinarySI,
            "1001Gi",
            "1025024Mi",
        ),
        (1024 * 1024 * 1024 * 1024, 0, BinarySI, "1Ti", "1024Gi"),
        (5, 0, BinarySI, "5", "5000m"),
        (500, -3, BinarySI, "500m", "0.5"),
        (1, 9, DecimalSI, "1G", "1000M"),
        (1000, 6, DecimalSI, "1G", "0.001T"),
        (1_000_000, 3, DecimalSI, "1G", ""),
        (1_000_000_000, 0, DecimalSI, "1G", ""),
        (1, -3, DecimalSI, "1m", "1000u"),
        (80, -3, DecimalSI, "80m", ""),
        (1080, -3, DecimalSI, "1080m", "1.08"),
        (108, -2, DecimalSI, "1080m", "1080000000n"),
        (10800, -4, DecimalSI, "1080m", ""),
        (300, 6, DecimalSI, "300M", ""),
        (1, 12, DecimalSI, "1T", ""),
        (1, 18, DecimalSI, "1E", ""),
        (1, 21, DecimalSI, "1e21", "1000E"),
        (5, 21, DecimalSI, "5e21", "5000E"),
        (1, 24, DecimalSI, "1e24", "1000000E"),
        (1_234_567, 6, DecimalSI, "1234567M", ""),
        (1_234_567, -3, BinarySI, "1234567m", ""),
        (3, 3, DecimalSI, "3k", ""),
        (1025, 0, BinarySI, "1025", ""),
        (0, 0, DecimalSI, "0", ""),
        (0, 0, BinarySI, "0", ""),
        (1, 9, DecimalExponent, "1e9", ".001e12"),
        (1, -3, DecimalExponent, "1e-3", "0.001e0"),
        (1, -9, DecimalExponent, "1e-9", "1000e-12"),
        (80, -3, DecimalExponent, "80e-3", ""),
        (300, 6, DecimalExponent, "300e6", ""),
        (1, 12, DecimalExponent, "1e12", ""),
        (1, 3, DecimalExponent, "1e3", ""),
        (3, 3, DecimalExponent, "3e3", ""),
        (3, 3, DecimalSI, "3k", ""),
        (0, 0, DecimalExponent, "0", "00"),
        (1, -9, DecimalSI, "1n", ""),
        (80, -9, DecimalSI, "80n", ""),
        (1080, -9, DecimalSI, "1080n", ""),
        (108, -8, DecimalSI, "1080n", ""),
        (10800, -10, DecimalSI, "1080n", ""),
        (1, -6, DecimalSI, "1u", ""),
        (80, -6, DecimalSI, "80u", ""),
        (1080, -6, DecimalSI, "1080u", ""),
    ];

    /// apimachinery's `TestQuantityParseEmit` table (same file): text in, canonical text out.
    const APIMACHINERY_PARSE_EMIT: &[(&str, &str)] = &[
        ("1Ki", "1Ki"),
        ("1Mi", "1Mi"),
        ("1Gi", "1Gi"),
        ("1024Mi", "1Gi"),
        ("1000M", "1G"),
        (".001Ki", "1024m"),
        (".000001Ki", "1024u"),
        (".000000001Ki", "1024n"),
        (".000000000001Ki", "2n"),
    ];

    /// `m * 10^e` in nanos (exact for the tables' rows).
    fn nanos_of(mantissa: i128, exponent: i32) -> i128 {
        let shift = exponent + 9;
        if shift >= 0 {
            mantissa * 10i128.pow(shift.unsigned_abs())
        } else {
            mantissa / 10i128.pow(shift.unsigned_abs())
        }
    }

    #[test]
    fn canonical_text_matches_apimachinerys_string_table() {
        for &(mantissa, exponent, format, canonical, alternate) in APIMACHINERY_STRING {
            let q = Quantity {
                nanos: nanos_of(mantissa, exponent),
                format,
            };
            assert_eq!(q.to_string(), canonical, "{mantissa}e{exponent} {format:?}");
            let negative = Quantity {
                nanos: -q.nanos,
                format,
            };
            if !q.is_zero() {
                assert_eq!(negative.to_string(), format!("-{canonical}"));
            }
            let reparsed = Quantity::parse(canonical).expect(canonical);
            assert_eq!(reparsed, q, "{canonical} parses to another value");
            assert_eq!(
                reparsed.to_string(),
                canonical,
                "{canonical} is not a fixed point"
            );
            if !alternate.is_empty() {
                let other = Quantity::parse(alternate).expect(alternate);
                assert_eq!(other.to_string(), canonical, "alternate {alternate}");
            }
        }
    }

    #[test]
    fn parse_then_emit_matches_apimachinerys_table() {
        for &(text, canonical) in APIMACHINERY_PARSE_EMIT {
            let q = Quantity::parse(text).expect(text);
            assert_eq!(q.to_string(), canonical, "{text}");
            let negative = Quantity::parse(&format!("-{text}")).expect(text);
            assert_eq!(negative.to_string(), format!("-{canonical}"), "-{text}");
        }
        // TestMilliNewSet and TestNewSet, the DecimalSI rows.
        for (millis, canonical) in [(1, "1m"), (1000, "1"), (1_234_000, "1234")] {
            assert_eq!(Quantity::from_millis(millis).to_string(), canonical);
        }
        for (units, canonical) in [(1, "1"), (1000, "1k"), (1_234_000, "1234k")] {
            assert_eq!(Quantity::from_units(units).to_string(), canonical);
        }
        // TestQuantityAddZeroPreservesSuffix: zero plus a quantity keeps its format.
        for text in ["100m", "1Gi"] {
            let q = Quantity::parse(text).expect(text);
            assert_eq!(q.saturating_add(Quantity::ZERO).to_string(), text);
            assert_eq!(Quantity::ZERO.saturating_add(q).to_string(), text);
        }
    }

    #[test]
    fn parse_matches_apimachinerys_table_signs_saturation_and_invalid_strings() {
        for &(text, mantissa, exponent, format) in APIMACHINERY_PARSE {
            let nanos = nanos_of(mantissa, exponent);
            for (sign, want) in [("", nanos), ("-", -nanos), ("+", nanos)] {
                let input = format!("{sign}{text}");
                let got = Quantity::parse(&input).unwrap_or_else(|e| panic!("{input}: {e}"));
                assert_eq!(got.nanos, want, "{input}");
                assert_eq!(got.format, format, "{input}");
            }
        }
        for text in ["9Ei", "9223372036854775807Ki"] {
            let q = Quantity::parse(text).expect(text);
            assert_eq!(q.nanos, MAX_NANOS, "{text} is maxAllowed");
            assert_eq!(q.value(), i64::MAX);
            assert_eq!(
                Quantity::parse(&format!("-{text}")).expect(text).nanos,
                -MAX_NANOS
            );
        }
        for text in [
            "1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-",
        ] {
            assert!(Quantity::parse(text).is_err(), "{text} parsed");
        }
        // The table's last two invalid strings, " 1" and "1 ", are refused by ParseQuantity
        // but accepted from JSON and YAML (`TestJSONWhitespace`: Quantity.UnmarshalJSON trims
        // them), which is where qosd's quantities come from.
        for text in [" 1", "1 "] {
            assert_eq!(Quantity::parse(text).map(|q| q.nanos), Ok(NANO), "{text:?}");
        }
    }

    #[test]
    fn a_huge_negative_exponent_rounds_up_to_a_nano_at_once() {
        // Found by the fuzzer: each further power of ten was a division, 50 million of them.
        let started = std::time::Instant::now();
        for text in [
            "1e-2000000000",
            "-7.5e-2147483000",
            "3Ei",
            "0.1e-2147483600",
        ] {
            let q = Quantity::parse(text).expect(text);
            assert!(q.nanos.abs() <= MAX_NANOS, "{text}");
        }
        assert_eq!(Quantity::parse("1e-2000000000").map(|q| q.nanos), Ok(1));
        assert_eq!(Quantity::parse("-7.5e-2147483000").map(|q| q.nanos), Ok(-1));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "took {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn precision_beyond_128_bits_is_still_rounded_up_exactly() {
        // 30 significant digits times Ei's 2^60 pass 128 bits before the division.
        let q = Quantity::parse("0.000000000000000000123456789012345678901234567891Ei")
            .expect("parses");
        // 123456789012345678901234567891e-48 * 2^60 units = 142335986.94... nanos.
        assert_eq!(q.nanos, 142_335_987);
        // More than 30 significant digits: the dropped ones round up.
        assert_eq!(
            Quantity::parse("1.0000000000000000000000000000000001").map(|q| q.nanos),
            Ok(NANO + 1)
        );
        assert_eq!(
            Quantity::parse("1.0000000000000000000000000000000000").map(|q| q.nanos),
            Ok(NANO)
        );
        assert!(matches!(
            Quantity::parse("1e99"),
            Err(QuantityError::OutOfRange(_))
        ));
        assert_eq!(
            Quantity::parse("99999999999999999999999999999999999999Ei").map(|q| q.nanos),
            Ok(MAX_NANOS)
        );
        assert_eq!(Quantity::parse("1e-99").map(|q| q.nanos), Ok(1));
    }

    /// Rows mirror apimachinery's `TestQuantityParse` / `TestQuantityValue` expectations
    /// (k8s.io/apimachinery/pkg/api/resource/quantity_test.go).
    #[test]
    fn parses_like_apimachinery() {
        let cases: &[(&str, i64, i64)] = &[
            // text, Value(), MilliValue()
            ("500m", 1, 500),
            ("1.5", 2, 1500),
            ("1", 1, 1000),
            ("0", 0, 0),
            ("1Gi", 1 << 30, (1 << 30) * 1000),
            ("1Ki", 1024, 1_024_000),
            ("1e3", 1000, 1_000_000),
            ("1E3", 1000, 1_000_000),
            ("128974848", 128_974_848, 128_974_848_000),
            ("129M", 129_000_000, 129_000_000_000),
            ("123Mi", 123 * (1 << 20), 123 * (1 << 20) * 1000),
            ("100n", 1, 1),
            ("1u", 1, 1),
            ("0.1m", 1, 1),
            ("1.5Gi", 1_610_612_736, 1_610_612_736_000),
            ("+2", 2, 2000),
            ("-1", -1, -1000),
            ("12e-1", 2, 1200),
            (".5", 1, 500),
        ];
        for (text, value, milli) in cases {
            let q = Quantity::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(q.value(), *value, "{text}.Value()");
            assert_eq!(q.milli_value(), *milli, "{text}.MilliValue()");
        }
    }

    #[test]
    fn malformed_values_are_rejected_with_the_value() {
        for bad in ["", "abc", "1.2.3", "1Zi", "m", "1e", "1.5x", "--1", "1 Gi"] {
            let err = Quantity::parse(bad).expect_err(bad);
            assert!(
                err.to_string().contains(&format!("{bad:?}")),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn huge_values_are_out_of_range() {
        assert!(matches!(
            Quantity::parse("99999999999999999999999999E"),
            Err(QuantityError::OutOfRange(_))
        ));
    }

    #[test]
    fn deserializes_strings_and_numbers() {
        let q: Quantity = serde_json::from_str("\"250m\"").expect("string");
        assert_eq!(q.milli_value(), 250);
        let q: Quantity = serde_json::from_str("2").expect("int");
        assert_eq!(q.milli_value(), 2000);
        let q: Quantity = serde_json::from_str("0.5").expect("float");
        assert_eq!(q.milli_value(), 500);
        let err = serde_json::from_str::<Quantity>("\"5x\"").expect_err("bad suffix");
        assert!(err.to_string().contains("5x"), "{err}");
    }
}
