//! Kubernetes resource quantities (`500m`, `1.5`, `1Gi`, `1e3`, `129M`), parsed the way
//! apimachinery's `resource.ParseQuantity` accepts them and held exactly as a rational number,
//! so `Value()` / `MilliValue()` round up like Kubernetes does.
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

/// An exact quantity: `numerator / 10^scale_down` where the suffix has been applied.
///
/// Ordering and equality are exact (`resource.Quantity.Cmp`): `1` == `1000m` and `0.5m` < `1m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    /// Value times 10^9 (nano units), which covers every decimal suffix down to `n`.
    nanos: i128,
}

const NANO: i128 = 1_000_000_000;

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
        if digits.len() > 30 {
            return Err(QuantityError::OutOfRange(text.to_owned()));
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits
                .parse()
                .map_err(|_| QuantityError::Malformed(text.to_owned()))?
        };
        let mut exponent10 = -i32::try_from(fraction.len())
            .map_err(|_| QuantityError::OutOfRange(text.to_owned()))?;
        let mut multiplier: i128 = 1;
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
            "Ki" => multiplier = 1 << 10,
            "Mi" => multiplier = 1 << 20,
            "Gi" => multiplier = 1 << 30,
            "Ti" => multiplier = 1 << 40,
            "Pi" => multiplier = 1 << 50,
            "Ei" => multiplier = 1 << 60,
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
            }
        }
        let out_of_range = || QuantityError::OutOfRange(text.to_owned());
        // nanos = mantissa * multiplier * 10^(exponent10 + 9), rounded up when precision is lost.
        let scaled = mantissa.checked_mul(multiplier).ok_or_else(out_of_range)?;
        let shift = exponent10 + 9;
        let nanos = if shift >= 0 {
            let factor = 10i128
                .checked_pow(u32::try_from(shift).map_err(|_| out_of_range())?)
                .ok_or_else(out_of_range)?;
            scaled.checked_mul(factor).ok_or_else(out_of_range)?
        } else {
            let divisor = 10i128
                .checked_pow(u32::try_from(-shift).map_err(|_| out_of_range())?)
                .unwrap_or(i128::MAX);
            ceil_div(scaled, divisor)
        };
        // Kubernetes caps quantities at 2^63-1 in their largest unit; anything near i64::MAX
        // units is nonsense for resources.
        if nanos / NANO > i128::from(i64::MAX) {
            return Err(out_of_range());
        }
        Ok(Self {
            nanos: if negative { -nanos } else { nanos },
        })
    }

    /// Zero.
    pub const ZERO: Self = Self { nanos: 0 };

    /// The exact sum, saturating at the representable range (`resource.Quantity.Add`).
    #[must_use]
    pub fn saturating_add(self, other: Self) -> Self {
        Self {
            nanos: self.nanos.saturating_add(other.nanos),
        }
    }

    /// A quantity of whole units.
    #[must_use]
    pub fn from_units(units: i64) -> Self {
        Self {
            nanos: i128::from(units) * NANO,
        }
    }

    /// A quantity of thousandths (`millicores`).
    #[must_use]
    pub fn from_millis(millis: i64) -> Self {
        Self {
            nanos: i128::from(millis) * 1_000_000,
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

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos % NANO == 0 {
            write!(f, "{}", self.nanos / NANO)
        } else if self.nanos % 1_000_000 == 0 {
            write!(f, "{}m", self.nanos / 1_000_000)
        } else {
            write!(f, "{}n", self.nanos)
        }
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
    use super::*;

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
