//! Manifest text to pods: YAML documents split at `---` / `...` lines (line numbers kept the
//! file's), one JSON value per file, `kind: Pod` or a `List` of them, each pod defaulted and
//! validated; every problem is a [`DocumentError`] naming the document and the field.
use serde_yaml_ng::Value;

use super::{DocumentError, ManifestFormat, ParsedPod};
use crate::pods::model::Pod;
use crate::pods::validate::validate_pod;

/// Parses the text of one manifest file into defaulted, validated pods, one result per pod
/// (a `List` gives one per item) in document order.
#[must_use]
pub fn parse_manifest(text: &str, format: ManifestFormat) -> Vec<Result<ParsedPod, DocumentError>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut out = Vec::new();
    match format {
        ManifestFormat::Json => {
            if text.trim().is_empty() {
                return out;
            }
            let value = serde_json::from_str::<serde_json::Value>(text)
                .map_err(|e| e.to_string())
                .and_then(|json| serde_yaml_ng::to_value(json).map_err(|e| e.to_string()));
            match value {
                Ok(value) => pods_from_value(1, value, &mut out),
                Err(reason) => out.push(Err(parse_error(1, None, reason))),
            }
        }
        ManifestFormat::Yaml => {
            for (index, padded) in split_yaml_documents(text).into_iter().enumerate() {
                let document = index + 1;
                let brackets = bracket_count(&padded);
                if brackets > MAX_BRACKETS {
                    out.push(Err(parse_error(
                        document,
                        None,
                        format!(
                            "{brackets} opening brackets ([ and {{) in one document, more than {MAX_BRACKETS}: flow collections could nest that deep"
                        ),
                    )));
                    continue;
                }
                if flow_depth(&padded) > MAX_FLOW_DEPTH {
                    out.push(Err(parse_error(
                        document,
                        None,
                        format!(
                            "flow collections ([...], {{...}}) nested deeper than {MAX_FLOW_DEPTH} levels"
                        ),
                    )));
                    continue;
                }
                let value = serde_yaml_ng::from_str::<Value>(&padded).and_then(|mut v| {
                    v.apply_merge()?;
                    Ok(v)
                });
                match value {
                    Ok(value) => pods_from_value(document, value, &mut out),
                    Err(e) => out.push(Err(parse_error(document, None, e.to_string()))),
                }
            }
        }
    }
    out
}

/// Deepest nesting of YAML flow collections accepted before parsing. The YAML parser takes
/// time quadratic in this depth (1.2 s at 30,000 levels, 19 s at 100,000, both well within
/// the 4 MiB file limit), and its deserializer refuses more than 128 levels anyway; a Pod
/// nests fewer than 20.
const MAX_FLOW_DEPTH: usize = 128;

/// Most `[` and `{` characters a YAML document may hold, anywhere (quoted, commented or not).
/// No lexing can be fooled about this count, and flow collections cannot nest deeper than it,
/// so it bounds the parser's time whatever [`flow_depth`] makes of the text: its time grows
/// with the square of the depth, so 10,000 levels cost a hundredth of 100,000's (see
/// [`MAX_FLOW_DEPTH`]), and a Pod written in flow style needs a few hundred brackets.
const MAX_BRACKETS: usize = 10_000;

/// The `[` and `{` characters in `text`.
pub(super) fn bracket_count(text: &str) -> usize {
    text.bytes().filter(|b| matches!(b, b'[' | b'{')).count()
}

/// The deepest nesting of `[` and `{` outside quoted scalars and comments, in one linear pass:
/// an estimate for a clear message, not a YAML parser. It can be wrong about where a quoted
/// scalar begins (an apostrophe after a space in a plain scalar, `a: x 'y`, looks like one and
/// hides what follows); [`MAX_BRACKETS`], checked first, bounds the parser's time in that case,
/// and the deserializer refuses more than 128 levels itself.
pub(super) fn flow_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut quote: Option<char> = None;
    let mut previous = '\n';
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some('\''), '\'') if chars.peek() == Some(&'\'') => {
                chars.next();
            }
            (Some('"'), '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            // Where a quoted scalar can begin; an apostrophe inside a plain scalar (`don't`)
            // is text.
            (None, '\'' | '"') if matches!(previous, ' ' | '\t' | '\n' | '[' | '{' | ',') => {
                quote = Some(c);
            }
            (None, '#') if previous.is_whitespace() => {
                for skipped in chars.by_ref() {
                    if skipped == '\n' {
                        break;
                    }
                }
                previous = '\n';
                continue;
            }
            (None, '[' | '{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            (None, _) => {}
        }
        previous = c;
    }
    deepest
}

fn parse_error(document: usize, path: Option<String>, reason: String) -> DocumentError {
    DocumentError::Parse {
        document,
        path,
        reason,
    }
}

/// Splits YAML text at `---` (document start) and `...` (document end) lines, dropping
/// documents with nothing but blank lines, comments and directives. Each document is padded
/// with newlines so that the parser's line numbers are the file's.
fn split_yaml_documents(text: &str) -> Vec<String> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut current_start = 0;
    let mut flush = |current: &mut String, start: usize| {
        if has_content(current) {
            let mut padded = "\n".repeat(start);
            padded.push_str(current);
            docs.push(padded);
        }
        current.clear();
    };
    for (number, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_marker(bare, "---") {
            flush(&mut current, current_start);
            current_start = number;
            current.push_str(line);
        } else if is_marker(bare, "...") {
            flush(&mut current, current_start);
            current_start = number + 1;
        } else {
            current.push_str(line);
        }
    }
    flush(&mut current, current_start);
    docs
}

fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

fn has_content(doc: &str) -> bool {
    doc.lines().any(|line| {
        let line = if is_marker(line, "---") {
            &line[3..]
        } else {
            line
        };
        let line = line.trim();
        !(line.is_empty() || line.starts_with('#') || line.starts_with('%'))
    })
}

/// Checks `apiVersion` / `kind` and reads a Pod, or each Pod of a List.
fn pods_from_value(document: usize, value: Value, out: &mut Vec<Result<ParsedPod, DocumentError>>) {
    if !matches!(value, Value::Mapping(_)) {
        out.push(Err(parse_error(
            document,
            None,
            format!(
                "expected a Pod or a List of Pods, found {}",
                describe(&value)
            ),
        )));
        return;
    }
    if let Err(e) = check_type_meta(document, &value, "", false) {
        out.push(Err(e));
        return;
    }
    if value.get("kind").and_then(Value::as_str) == Some("Pod") {
        out.push(decode_pod(document, value, ""));
        return;
    }
    // A List or PodList (check_type_meta allowed nothing else).
    let items = match value {
        Value::Mapping(mut map) => map.remove("items"),
        _ => None,
    };
    let items = match items {
        None | Some(Value::Null) => return,
        Some(Value::Sequence(items)) => items,
        Some(other) => {
            out.push(Err(parse_error(
                document,
                Some("items".into()),
                format!("expected a list of Pods, found {}", describe(&other)),
            )));
            return;
        }
    };
    for (i, item) in items.into_iter().enumerate() {
        if !matches!(item, Value::Mapping(_)) {
            out.push(Err(parse_error(
                document,
                Some(format!("items[{i}]")),
                format!("expected a Pod, found {}", describe(&item)),
            )));
            continue;
        }
        let prefix = format!("items[{i}].");
        match check_type_meta(document, &item, &prefix, true) {
            Ok(()) => out.push(decode_pod(document, item, &prefix)),
            Err(e) => out.push(Err(e)),
        }
    }
}

/// `apiVersion` must be `v1`; `kind` must be `Pod`, or at top level `List` / `PodList`.
/// List items may leave both out (a PodList's items do).
fn check_type_meta(
    document: usize,
    value: &Value,
    prefix: &str,
    item: bool,
) -> Result<(), DocumentError> {
    let field = |name: &str| Some(format!("{prefix}{name}"));
    match value.get("apiVersion") {
        Some(Value::String(v)) if v == "v1" => {}
        None if item => {}
        None => {
            return Err(parse_error(
                document,
                field("apiVersion"),
                "required (want \"v1\")".into(),
            ));
        }
        Some(other) => {
            return Err(parse_error(
                document,
                field("apiVersion"),
                format!("{} is not supported (want \"v1\")", describe(other)),
            ));
        }
    }
    let want = if item { "Pod" } else { "Pod, List or PodList" };
    match value.get("kind") {
        Some(Value::String(k)) if k == "Pod" => Ok(()),
        Some(Value::String(k)) if !item && (k == "List" || k == "PodList") => Ok(()),
        None if item => Ok(()),
        None => Err(parse_error(
            document,
            field("kind"),
            format!("required (want {want})"),
        )),
        Some(other) => Err(parse_error(
            document,
            field("kind"),
            format!("{} is not supported (want {want})", describe(other)),
        )),
    }
}

/// Deserializes, defaults and validates one pod; errors carry the field path.
fn decode_pod(document: usize, value: Value, prefix: &str) -> Result<ParsedPod, DocumentError> {
    let mut pod: Pod = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." {
            prefix
                .strip_suffix('.')
                .map(str::to_owned)
                .filter(|p| !p.is_empty())
        } else {
            Some(format!("{prefix}{path}"))
        };
        parse_error(document, path, e.into_inner().to_string())
    })?;
    pod.apply_defaults();
    validate_pod(&pod).map_err(|errors| DocumentError::Invalid {
        document,
        errors: errors.with_prefix(prefix),
    })?;
    Ok(ParsedPod { document, pod })
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("{s:?}"),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "an object".into(),
        Value::Tagged(t) => format!("tagged value {}", t.tag),
    }
}
