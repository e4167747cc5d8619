//! The library's enums in the lab's JSON records, as they were written when the library derived
//! serde itself (it no longer depends on serde): a [`DType`](flash_attn::DType) or an
//! [`Algorithm`](flash_attn::Algorithm) by its name (`bf16`, `fa2-tc`: its `Display`, read back
//! with its `FromStr`), a [`Layout`] by its variant's name (`BatchHeadSeqDim`).
//!
//! On a field: `#[serde(with = "crate::names")]`, `#[serde(with = "crate::names::list")]` for a
//! `Vec` of them, `#[serde(serialize_with = "crate::names::layout")]`.

use std::fmt::Display;
use std::str::FromStr;

use flash_attn::Layout;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

/// Writes `value` by its name.
pub fn serialize<T: Display, S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// Reads a value from its name.
pub fn deserialize<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: FromStr<Err: Display>,
    D: Deserializer<'de>,
{
    String::deserialize(deserializer)?
        .parse()
        .map_err(D::Error::custom)
}

/// A list of values, each by its name.
pub mod list {
    use super::*;

    pub fn serialize<T: Display, S: Serializer>(
        values: &[T],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(values.iter().map(ToString::to_string))
    }

    pub fn deserialize<'de, T, D>(deserializer: D) -> Result<Vec<T>, D::Error>
    where
        T: FromStr<Err: Display>,
        D: Deserializer<'de>,
    {
        Vec::<String>::deserialize(deserializer)?
            .iter()
            .map(|name| name.parse().map_err(D::Error::custom))
            .collect()
    }
}

/// Writes a layout by its variant's name, as serde's derive did.
pub fn layout<S: Serializer>(layout: &Layout, serializer: S) -> Result<S::Ok, S::Error> {
    let (index, variant) = match layout {
        Layout::BatchHeadSeqDim => (0, "BatchHeadSeqDim"),
        Layout::BatchSeqHeadDim => (1, "BatchSeqHeadDim"),
    };
    serializer.serialize_unit_variant("Layout", index, variant)
}

#[cfg(test)]
mod tests {
    use flash_attn::{Algorithm, DType, Layout};

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Record {
        #[serde(with = "crate::names")]
        dtype: DType,
        #[serde(with = "crate::names::list")]
        algorithms: Vec<Algorithm>,
    }

    #[test]
    fn names_are_written_and_read_back_as_the_derive_did() {
        let record = Record {
            dtype: DType::Bf16,
            algorithms: vec![Algorithm::Fa2Tc, Algorithm::Fa3, Algorithm::Standard],
        };
        let text = serde_json::to_string(&record).unwrap();
        assert_eq!(
            text,
            r#"{"dtype":"bf16","algorithms":["fa2-tc","fa3","standard"]}"#
        );
        assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), record);
        let error = serde_json::from_str::<Record>(r#"{"dtype":"f64","algorithms":[]}"#);
        assert!(error.unwrap_err().to_string().contains("f64"));
    }

    #[test]
    fn a_layout_is_written_by_its_variant() {
        #[derive(serde::Serialize)]
        struct Row {
            #[serde(serialize_with = "crate::names::layout")]
            layout: Layout,
        }
        let text = serde_json::to_string(&Row {
            layout: Layout::BatchSeqHeadDim,
        })
        .unwrap();
        assert_eq!(text, r#"{"layout":"BatchSeqHeadDim"}"#);
    }
}
