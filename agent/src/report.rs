//! The document `/inspect` serves and `qosd inspect` prints: the running agent's state as
//! tables a person reads the way `kubectl get` output is read (one row per thing, aligned
//! columns), and the same state as structured JSON for scripts (`qosd inspect -o json`).
//!
//! The manager that owns the state builds a [`Report`] on its own thread when asked (see
//! [`crate::metrics::server::Inspect`]); the client only formats it.
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// What `/inspect` answers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `standalone`, `kubernetes`, or `probes only`.
    pub mode: String,
    /// Key facts, one line each (pod source, cgroup driver, counts).
    #[serde(default)]
    pub summary: Vec<(String, String)>,
    /// The tables, in order.
    #[serde(default)]
    pub sections: Vec<Section>,
    /// Everything above as structured data, for scripts.
    #[serde(default)]
    pub data: serde_json::Value,
}

/// One table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Section {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Said when there are no rows (`none`, `feedback off`).
    #[serde(default)]
    pub empty: String,
}

impl Section {
    /// A table with these column names.
    #[must_use]
    pub fn new(title: &str, columns: &[&str]) -> Self {
        Self {
            title: title.to_owned(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows: Vec::new(),
            empty: "none".to_owned(),
        }
    }

    /// Adds a row (cells beyond the columns are dropped, missing ones are empty).
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut row: Vec<String> = cells.into_iter().map(Into::into).collect();
        row.resize(self.columns.len(), String::new());
        self.rows.push(row);
    }
}

impl Report {
    /// A report with nothing to show but a message (no manager running).
    #[must_use]
    pub fn message(mode: &str, text: &str) -> Self {
        Self {
            mode: mode.to_owned(),
            summary: vec![("state".to_owned(), text.to_owned())],
            sections: Vec::new(),
            data: serde_json::json!({"mode": mode, "state": text}),
        }
    }

    /// The tables as text: the summary as `key: value` lines, then each section's title and
    /// its rows under upper-case column names, columns two spaces apart.
    #[must_use]
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "mode: {}", self.mode);
        for (key, value) in &self.summary {
            let _ = writeln!(out, "{key}: {value}");
        }
        for section in &self.sections {
            let _ = writeln!(out, "\n{}", section.title);
            if section.rows.is_empty() {
                let _ = writeln!(out, "  ({})", section.empty);
                continue;
            }
            let mut widths: Vec<usize> =
                section.columns.iter().map(|c| c.chars().count()).collect();
            for row in &section.rows {
                for (i, cell) in row.iter().enumerate() {
                    if let Some(w) = widths.get_mut(i) {
                        *w = (*w).max(cell.chars().count());
                    }
                }
            }
            let line = |cells: &[String]| {
                let mut text = String::new();
                for (i, cell) in cells.iter().enumerate() {
                    if i + 1 == cells.len() {
                        text.push_str(cell);
                    } else {
                        let pad = widths[i].saturating_sub(cell.chars().count()) + 2;
                        text.push_str(cell);
                        text.push_str(&" ".repeat(pad));
                    }
                }
                text.trim_end().to_owned()
            };
            let header: Vec<String> = section.columns.iter().map(|c| c.to_uppercase()).collect();
            let _ = writeln!(out, "{}", line(&header));
            for row in &section.rows {
                let _ = writeln!(out, "{}", line(row));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_aligned_like_kubectl_output() {
        let mut pods = Section::new("PODS", &["namespace", "name", "qos"]);
        pods.row(["default", "web", "burstable"]);
        pods.row(["kube-system", "dns", "guaranteed"]);
        let report = Report {
            mode: "kubernetes".into(),
            summary: vec![("source".into(), "API server".into())],
            sections: vec![pods, Section::new("DRIFT", &["file"])],
            data: serde_json::Value::Null,
        };
        assert_eq!(
            report.to_text(),
            "mode: kubernetes\nsource: API server\n\nPODS\nNAMESPACE    NAME  QOS\ndefault      web   burstable\nkube-system  dns   guaranteed\n\nDRIFT\n  (none)\n"
        );
        let back: Report =
            serde_json::from_str(&serde_json::to_string(&report).expect("json")).expect("parse");
        assert_eq!(back, report);
    }

    #[test]
    fn short_and_long_rows_fit_the_columns() {
        let mut s = Section::new("T", &["a", "b"]);
        s.row(["1"]);
        s.row(["1", "2", "3"]);
        assert_eq!(
            s.rows,
            [
                vec!["1".to_owned(), String::new()],
                vec!["1".into(), "2".into()]
            ]
        );
    }
}
