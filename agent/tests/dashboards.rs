//! The Grafana dashboards in `dashboards/*.json` (every one: `qosd-node.json`,
//! `qosd-cluster.json`, ...) against the metrics qosd exports and against each other, without
//! root and without Prometheus: every dashboard is valid JSON with unique panel ids, its own
//! `uid`, `schemaVersion` 39, no `__inputs` and a `$datasource` variable; every panel says what
//! it shows and has a query; every `$variable` a query uses is defined; every `rate` is over
//! `$__rate_interval`; every metric name in any PromQL expression (panel targets and variable
//! queries) is one qosd exports, so a renamed metric fails here instead of silently emptying a
//! panel; and every dashboard link and data link to a Grafana dashboard (`/d/<uid>...`) names
//! one of these dashboards, passes only variables that dashboard defines and only series labels
//! its panel's queries keep.
//!
//! The exported names are read from the code that defines them: the `"qosd_..."` string
//! literals of `agent/src/metrics/*.rs` and of every module's `metrics.rs`
//! (`agent/src/cm/metrics.rs`, ...), their test modules excepted. A histogram's `_bucket`, `_sum` and `_count` series count as its base name.
//! `tests/src/cases/prometheus.rs` runs the same queries through a real Prometheus.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Grafana's built-in variables a query may use without defining them.
const GRAFANA_BUILTINS: &[&str] = &[
    "__rate_interval",
    "__interval",
    "__interval_ms",
    "__range",
    "__range_s",
    "__range_ms",
];

/// Series suffixes of a histogram (or summary) that name the base metric.
const HISTOGRAM_SUFFIXES: &[&str] = &["_bucket", "_sum", "_count"];

/// PromQL aggregation operators: identifiers that may be followed by `by (...)` instead of `(`.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// PromQL keywords that are never metric names.
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or_else(|| panic!("agent/ has a parent directory"))
        .to_owned()
}

/// Every `dashboards/*.json`, parsed, by file name.
fn dashboards() -> BTreeMap<String, Value> {
    let dir = repo_root().join("dashboards");
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    let mut out = BTreeMap::new();
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
            .path();
        if path.extension().is_none_or(|ext| ext != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.insert(name, value);
    }
    assert!(!out.is_empty(), "no dashboards/*.json in {}", dir.display());
    out
}

/// Every panel of a dashboard, rows included, and the panels nested in collapsed rows.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            if let Some(nested) = panel.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// The PromQL expressions of a panel's targets.
fn panel_exprs(panel: &Value) -> Vec<&str> {
    panel["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["expr"].as_str())
        .collect()
}

/// A query variable's query string (Grafana stores it as a string or as `{query: ...}`).
fn variable_query(variable: &Value) -> Option<&str> {
    variable["query"]
        .as_str()
        .or_else(|| variable["query"]["query"].as_str())
}

/// The PromQL inside a `label_values(EXPR, label)` variable query (`None` for
/// `label_values(label)`, which names no metric).
fn label_values_expr(query: &str) -> Option<&str> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (expr, _label) = inner.rsplit_once(',')?;
    Some(expr.trim())
}

/// Every PromQL expression of a dashboard, with where it is: panel targets, then the
/// `label_values` expressions of its query variables.
fn exprs(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        for expr in panel_exprs(panel) {
            out.push((format!("panel {title:?}"), expr.to_owned()));
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let name = variable["name"].as_str().unwrap_or_default();
        if let Some(expr) = variable_query(variable).and_then(label_values_expr) {
            out.push((format!("variable ${name}"), expr.to_owned()));
        }
    }
    out
}

/// The metric names qosd exports: every string literal that is exactly `qosd_<name>` in the
/// files that define metrics (`agent/src/metrics/*.rs` and every module's `metrics.rs`, such
/// as `agent/src/cm/metrics.rs`), outside their `#[cfg(test)]` modules.
fn exported_metric_names() -> BTreeSet<String> {
    fn metric_sources(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            if path.is_dir() {
                metric_sources(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "rs")
                && (path.file_name().is_some_and(|n| n == "metrics.rs")
                    || path.parent().is_some_and(|p| p.ends_with("src/metrics")))
            {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    metric_sources(&repo_root().join("agent/src"), &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("cm/metrics.rs")),
        "agent/src/cm/metrics.rs not found among {files:?}"
    );
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (start, _) in code.match_indices("\"qosd_") {
            let rest = &code[start + 1..];
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            if rest[len..].starts_with('"') {
                names.insert(rest[..len].to_owned());
            }
        }
    }
    names
}

/// Metric names in a PromQL expression: identifiers that are not functions, aggregations,
/// keywords, label names (in `{...}` or in `by (...)`-style lists), durations, numbers,
/// string contents or Grafana variables.
fn metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let (mut braces, mut brackets) = (0usize, 0usize);
    let mut label_list_next = false;
    let mut in_label_list = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' && c != '`' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '$' => {
                i += 1;
                if chars.get(i) == Some(&'{') {
                    while i < chars.len() && chars[i] != '}' {
                        i += 1;
                    }
                    i += 1;
                } else {
                    while i < chars.len() && ident_char(chars[i]) {
                        i += 1;
                    }
                }
            }
            '{' => {
                braces += 1;
                i += 1;
            }
            '}' => {
                braces = braces.saturating_sub(1);
                i += 1;
            }
            '[' => {
                brackets += 1;
                i += 1;
            }
            ']' => {
                brackets = brackets.saturating_sub(1);
                i += 1;
            }
            '(' => {
                if label_list_next {
                    in_label_list = true;
                    label_list_next = false;
                }
                i += 1;
            }
            ')' => {
                in_label_list = false;
                i += 1;
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if ident_start(c) => {
                let start = i;
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = chars[i..].iter().find(|c| !c.is_whitespace());
                if braces > 0 || brackets > 0 || in_label_list {
                    continue;
                }
                if LABEL_LIST_KEYWORDS.contains(&word.as_str()) {
                    label_list_next = true;
                    continue;
                }
                if KEYWORDS.contains(&word.as_str())
                    || AGGREGATIONS.contains(&word.as_str())
                    || next == Some(&'(')
                {
                    continue;
                }
                names.push(word);
            }
            _ => i += 1,
        }
    }
    names
}

/// `$name` and `${name...}` variables a query uses.
fn variables_used(expr: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for (start, _) in expr.match_indices('$') {
        let rest = &expr[start + 1..];
        let rest = rest.strip_prefix('{').unwrap_or(rest);
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if len > 0 {
            used.insert(rest[..len].to_owned());
        }
    }
    used
}

/// Whether `name` is exported, counting a histogram's series as its base name.
fn is_exported(name: &str, exported: &BTreeSet<String>) -> bool {
    exported.contains(name)
        || HISTOGRAM_SUFFIXES.iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| exported.contains(base))
        })
}

#[test]
fn every_dashboard_is_valid_json_with_unique_panel_ids() {
    for (file, dashboard) in dashboards() {
        assert!(
            dashboard.is_object(),
            "{file}: the top level is not an object"
        );
        let mut seen = BTreeSet::new();
        for panel in panels(&dashboard) {
            let id = panel["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("{file}: panel {:?} has no numeric id", panel["title"]));
            assert!(
                seen.insert(id),
                "{file}: panel id {id} is used twice (second: {:?})",
                panel["title"]
            );
        }
        assert!(!seen.is_empty(), "{file}: no panels");
    }
}

#[test]
fn every_metric_in_a_dashboard_query_is_exported_by_qosd() {
    let exported = exported_metric_names();
    // The scan itself works: the first metric qosd ever exported is found in the sources.
    assert!(
        exported.contains("qosd_cgroup_cpu_seconds_total"),
        "scanning the metric sources found {exported:?}"
    );
    let mut unknown = Vec::new();
    let mut checked = 0;
    for (file, dashboard) in dashboards() {
        for (place, expr) in exprs(&dashboard) {
            let names = metric_names(&expr);
            assert!(
                !names.is_empty(),
                "{file}: {place}: no metric name in {expr:?}"
            );
            for name in names {
                checked += 1;
                if !is_exported(&name, &exported) {
                    unknown.push(format!("{file}: {place}: {name} in {expr:?}"));
                }
            }
        }
    }
    assert!(checked > 0, "no metric names found in any query");
    assert!(
        unknown.is_empty(),
        "metrics qosd does not export (it exports {exported:?}):\n{}",
        unknown.join("\n")
    );
}

#[test]
fn every_panel_has_a_description_and_a_query_on_the_datasource_variable() {
    for (file, dashboard) in dashboards() {
        for panel in panels(&dashboard) {
            if panel["type"] == "row" {
                continue;
            }
            let title = panel["title"].as_str().unwrap_or_default();
            let description = panel["description"].as_str().unwrap_or_default();
            assert!(
                description.len() > 40,
                "{file}: panel {title:?} has no description saying what it shows"
            );
            assert!(
                !panel_exprs(panel).is_empty(),
                "{file}: panel {title:?} has no PromQL target"
            );
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{file}: panel {title:?} does not query the $datasource variable"
            );
        }
    }
}

#[test]
fn every_variable_a_query_uses_is_defined() {
    for (file, dashboard) in dashboards() {
        let defined: BTreeSet<String> = dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str().map(str::to_owned))
            .chain(GRAFANA_BUILTINS.iter().map(|b| (*b).to_owned()))
            .collect();
        let mut queries: Vec<(String, String)> = exprs(&dashboard);
        for variable in dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(query) = variable_query(variable) {
                queries.push((format!("variable {:?}", variable["name"]), query.to_owned()));
            }
        }
        for (place, expr) in queries {
            for used in variables_used(&expr) {
                assert!(
                    defined.contains(&used),
                    "{file}: {place} uses ${used}, which is not defined ({defined:?})"
                );
            }
        }
    }
}

#[test]
fn qosd_node_dashboard_has_datasource_instance_namespace_pod_and_qos_class_variables() {
    let all = dashboards();
    let dashboard = all
        .get("qosd-node.json")
        .unwrap_or_else(|| panic!("dashboards/qosd-node.json is missing"));
    assert_eq!(dashboard["schemaVersion"], 39);
    let variables: BTreeMap<&str, &Value> = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?, v)))
        .collect();
    let datasource = variables
        .get("datasource")
        .unwrap_or_else(|| panic!("no $datasource variable"));
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    let exported = exported_metric_names();
    for name in ["instance", "namespace", "pod", "qos_class"] {
        let variable = variables
            .get(name)
            .unwrap_or_else(|| panic!("no ${name} variable"));
        assert_eq!(variable["type"], "query", "${name}");
        let query = variable_query(variable).unwrap_or_default();
        let expr = label_values_expr(query).unwrap_or_else(|| {
            panic!("${name} is not label_values(<qosd metric>, {name}): {query:?}")
        });
        assert!(
            query.trim_end_matches(')').trim_end().ends_with(name),
            "${name} does not take the values of label {name}: {query:?}"
        );
        let metrics = metric_names(expr);
        assert!(
            !metrics.is_empty() && metrics.iter().all(|m| is_exported(m, &exported)),
            "${name} is not built from a qosd metric: {query:?}"
        );
    }
}

#[test]
fn every_dashboard_has_its_own_uid_schema_39_no_inputs_and_a_datasource_variable() {
    let mut uids: BTreeMap<String, String> = BTreeMap::new();
    for (file, dashboard) in dashboards() {
        let uid = dashboard["uid"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no uid (links between dashboards need one)"));
        assert!(!uid.is_empty(), "{file}: empty uid");
        if let Some(other) = uids.insert(uid.to_owned(), file.clone()) {
            panic!("{file} and {other} both have uid {uid:?}");
        }
        assert_eq!(dashboard["schemaVersion"], 39, "{file}: schemaVersion");
        assert!(
            dashboard.get("__inputs").is_none(),
            "{file}: has __inputs (the data source is the $datasource variable, so it imports as it is)"
        );
        let datasource = variables(&dashboard)
            .remove("datasource")
            .unwrap_or_else(|| panic!("{file}: no $datasource variable"));
        assert_eq!(datasource["type"], "datasource", "{file}: $datasource");
        assert_eq!(datasource["query"], "prometheus", "{file}: $datasource");
    }
}

#[test]
fn every_rate_is_over_the_rate_interval() {
    for (file, dashboard) in dashboards() {
        for (place, expr) in exprs(&dashboard) {
            for (start, _) in expr.match_indices("rate(") {
                let window = expr[start..]
                    .split_once('[')
                    .and_then(|(_, rest)| rest.split_once(']'))
                    .map(|(window, _)| window);
                assert_eq!(
                    window,
                    Some("$__rate_interval"),
                    "{file}: {place}: a rate over another window than $__rate_interval in {expr:?}"
                );
            }
        }
    }
}

/// A dashboard's variables by name.
fn variables(dashboard: &Value) -> BTreeMap<String, Value> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?.to_owned(), v.clone())))
        .collect()
}

/// A link and where it is: the dashboard's own links, then every panel's links and data links
/// (`links`, `fieldConfig.defaults.links`, `links` overrides), with the panel.
struct Link<'a> {
    place: String,
    link: &'a Value,
    panel: Option<&'a Value>,
}

fn links(dashboard: &Value) -> Vec<Link<'_>> {
    let mut out: Vec<Link<'_>> = dashboard["links"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|link| Link {
            place: format!("dashboard link {:?}", link["title"]),
            link,
            panel: None,
        })
        .collect();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        let overrides = panel["fieldConfig"]["overrides"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|o| o["properties"].as_array().into_iter().flatten())
            .filter(|p| p["id"] == "links")
            .map(|p| &p["value"]);
        let lists = [&panel["links"], &panel["fieldConfig"]["defaults"]["links"]]
            .into_iter()
            .chain(overrides);
        for list in lists {
            for link in list.as_array().into_iter().flatten() {
                out.push(Link {
                    place: format!("panel {title:?} link {:?}", link["title"]),
                    link,
                    panel: Some(panel),
                });
            }
        }
    }
    out
}

/// The uid of a link to a Grafana dashboard (`/d/<uid>`, `/d/<uid>/<slug>?...`), if it is one.
fn linked_uid(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("/d/")?;
    let end = rest.find(['/', '?', '#', '&']).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The template references of a link URL: `${name}`, `${name:format}`, `${a.b.c}`,
/// `${__data.fields["x"]}` and `$name`, each as its full text without `$`, braces or format.
fn link_references(url: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut rest = url;
    while let Some(at) = rest.find('$') {
        let after = &rest[at + 1..];
        if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').unwrap_or(braced.len());
            let inner = &braced[..end];
            let (name, format) = match inner.split_once(':') {
                Some((name, format)) => (name, Some(format.to_owned())),
                None => (inner, None),
            };
            out.push((name.to_owned(), format));
            rest = &braced[end.min(braced.len())..];
        } else {
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            out.push((after[..len].to_owned(), None));
            rest = &after[len..];
        }
    }
    out
}

/// The series label (or table column) a data-link reference reads, if it reads one:
/// `__field.labels.x`, `__series.labels.x`, `__data.fields.x`, `__data.fields["x"]`.
fn referenced_label(reference: &str) -> Option<String> {
    ["__field.labels", "__series.labels", "__data.fields"]
        .iter()
        .find_map(|prefix| reference.strip_prefix(prefix))
        .map(|rest| {
            rest.trim_start_matches('.')
                .trim_start_matches("[\"")
                .trim_end_matches("\"]")
                .to_owned()
        })
}

/// Grafana's link variables, usable in any link URL without being defined.
const LINK_BUILTINS: &[&str] = &[
    "__url_time_range",
    "__from",
    "__to",
    "__all_variables",
    "__timezone",
    "__dashboard",
    "__org",
    "__user",
];

/// Aggregations that drop every label not named in their `by (...)` clause (`topk` and the
/// like keep their argument's labels).
const LABEL_DROPPING_AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "quantile",
];

/// The labels `expr`'s aggregations keep: every label named in one of its `by (...)` clauses,
/// or none when it aggregates without one (`sum(x)`); `None` when it does not aggregate (or
/// uses `without`, which keeps labels this does not know), so every label may remain. An
/// approximation that catches a data link reading a label its query sums away.
fn grouping_labels(expr: &str) -> Option<BTreeSet<String>> {
    if expr.contains("without") {
        return None;
    }
    let mut kept = BTreeSet::new();
    let mut aggregated = false;
    let bytes = expr.as_bytes();
    for (start, _) in expr.match_indices("by") {
        let before_ok =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let rest = expr[start + 2..].trim_start();
        if !before_ok || !rest.starts_with('(') {
            continue;
        }
        aggregated = true;
        let list = rest[1..].split(')').next().unwrap_or_default();
        kept.extend(
            list.split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned),
        );
    }
    let aggregates_all = LABEL_DROPPING_AGGREGATIONS.iter().any(|a| {
        expr.match_indices(a).any(|(start, _)| {
            let before = expr[..start].chars().next_back();
            let after = expr[start + a.len()..].trim_start();
            before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
                && after.starts_with('(')
        })
    });
    (aggregated || aggregates_all).then_some(kept)
}

#[test]
fn every_link_to_a_dashboard_names_one_here_with_its_variables_and_kept_labels() {
    let all = dashboards();
    let by_uid: BTreeMap<String, (&String, &Value)> = all
        .iter()
        .filter_map(|(file, d)| Some((d["uid"].as_str()?.to_owned(), (file, d))))
        .collect();
    let mut checked = 0;
    for (file, dashboard) in &all {
        let own = variables(dashboard);
        for Link { place, link, panel } in links(dashboard) {
            if link["type"] == "dashboards" {
                // A link by tags: some other dashboard here must carry one of them.
                let tags: Vec<&Value> = link["tags"].as_array().into_iter().flatten().collect();
                assert!(
                    all.iter().any(|(other, d)| other != file
                        && d["tags"]
                            .as_array()
                            .is_some_and(|t| t.iter().any(|tag| tags.contains(&tag)))),
                    "{file}: {place}: no other dashboard has any of the tags {tags:?}"
                );
                continue;
            }
            let url = link["url"].as_str().unwrap_or_default();
            let Some(uid) = linked_uid(url) else {
                continue;
            };
            checked += 1;
            let (target_file, target) = by_uid.get(uid).unwrap_or_else(|| {
                panic!(
                    "{file}: {place} links to uid {uid:?}, which no dashboards/*.json has ({:?})",
                    by_uid.keys().collect::<Vec<_>>()
                )
            });
            let theirs = variables(target);
            // var-NAME=... parameters name variables of the linked dashboard.
            for (start, _) in url.match_indices("var-") {
                let name: String = url[start + 4..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    theirs.contains_key(&name),
                    "{file}: {place} passes var-{name}, which {target_file} does not define ({:?})",
                    theirs.keys().collect::<Vec<_>>()
                );
            }
            for (reference, format) in link_references(url) {
                if let Some(label) = referenced_label(&reference) {
                    // A series label or table column: every query of the panel must keep it.
                    let panel = panel.unwrap_or_else(|| {
                        panic!("{file}: {place} reads {reference} outside a panel")
                    });
                    for expr in panel_exprs(panel) {
                        if let Some(kept) = grouping_labels(expr) {
                            assert!(
                                kept.contains(&label),
                                "{file}: {place} reads label {label:?}, which {expr:?} aggregates away"
                            );
                        }
                    }
                    continue;
                }
                if ["__value", "__field.name", "__series.name"]
                    .iter()
                    .any(|p| reference.starts_with(p))
                    || LINK_BUILTINS.contains(&reference.as_str())
                {
                    continue;
                }
                assert!(
                    own.contains_key(&reference),
                    "{file}: {place} uses ${reference}, which {file} does not define"
                );
                // ${name:queryparam} becomes var-name=...: the linked dashboard must have it too.
                if format.as_deref() == Some("queryparam") {
                    assert!(
                        theirs.contains_key(&reference),
                        "{file}: {place} passes ${{{reference}:queryparam}}, which {target_file} does not define"
                    );
                }
            }
        }
    }
    // The cluster view links into the node view, so there is at least one link to check.
    assert!(
        checked > 0,
        "no link to a dashboard found in any dashboards/*.json"
    );
}

#[test]
fn qosd_cluster_dashboard_has_datasource_node_namespace_and_qos_class_variables() {
    let all = dashboards();
    let dashboard = all
        .get("qosd-cluster.json")
        .unwrap_or_else(|| panic!("dashboards/qosd-cluster.json is missing"));
    assert_eq!(dashboard["uid"], "qosd-cluster");
    let variables = variables(dashboard);
    let exported = exported_metric_names();
    for (name, label) in [
        ("node", "instance"),
        ("namespace", "namespace"),
        ("qos_class", "qos_class"),
    ] {
        let variable = variables
            .get(name)
            .unwrap_or_else(|| panic!("no ${name} variable"));
        assert_eq!(variable["type"], "query", "${name}");
        assert_eq!(variable["multi"], true, "${name} is not multi-value");
        assert_eq!(variable["includeAll"], true, "${name} has no All");
        let query = variable_query(variable).unwrap_or_default();
        let expr = label_values_expr(query)
            .unwrap_or_else(|| panic!("${name} is not label_values(<qosd metric>, {label})"));
        assert!(
            query.trim_end_matches(')').trim_end().ends_with(label),
            "${name} does not take the values of label {label}: {query:?}"
        );
        let metrics = metric_names(expr);
        assert!(
            !metrics.is_empty() && metrics.iter().all(|m| is_exported(m, &exported)),
            "${name} is not built from a qosd metric: {query:?}"
        );
    }
    assert!(
        variable_query(&variables["namespace"])
            .is_some_and(|q| q.contains("qosd_cgroup_cpu_seconds_total")),
        "$namespace does not come from qosd_cgroup_cpu_seconds_total"
    );
    // The node view is reachable from the dashboard's own links.
    assert!(
        links(dashboard).iter().any(|l| l.panel.is_none()
            && linked_uid(l.link["url"].as_str().unwrap_or_default()) == Some("qosd-node")),
        "no dashboard link to the node view (uid qosd-node)"
    );
}

#[test]
fn link_helpers_find_uids_references_and_kept_labels() {
    assert_eq!(
        linked_uid("/d/qosd-node/qosd-node?var-instance=${__field.labels.instance}"),
        Some("qosd-node")
    );
    assert_eq!(linked_uid("/d/abc?x=1"), Some("abc"));
    assert_eq!(linked_uid("https://example.com/docs"), None);
    assert_eq!(
        link_references(
            "/d/x?var-a=${__data.fields[\"pod\"]}&${ns:queryparam}&$b&${__url_time_range}"
        ),
        [
            ("__data.fields[\"pod\"]".to_owned(), None),
            ("ns".to_owned(), Some("queryparam".to_owned())),
            ("b".to_owned(), None),
            ("__url_time_range".to_owned(), None),
        ]
    );
    assert_eq!(
        referenced_label("__data.fields[\"pod\"]").as_deref(),
        Some("pod")
    );
    assert_eq!(
        referenced_label("__field.labels.instance").as_deref(),
        Some("instance")
    );
    assert_eq!(referenced_label("namespace"), None);
    assert_eq!(
        grouping_labels(
            "topk(10, sum by (instance, pod) (rate(x[5s])) / sum by (instance, pod) (rate(y[5s])))"
        ),
        Some(BTreeSet::from(["instance".to_owned(), "pod".to_owned()]))
    );
    assert_eq!(
        grouping_labels("sum(rate(x{standby=\"1\"}[5s]))"),
        Some(BTreeSet::new())
    );
    assert_eq!(grouping_labels("rate(x[5s]) / 2"), None);
    assert_eq!(grouping_labels("topk(5, rate(x_sum[5s]))"), None);
}

#[test]
fn metric_names_skip_labels_functions_keywords_durations_and_variables() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le, qos_class) (rate(qosd_runqueue_latency_seconds_bucket{instance=~\"$instance\", pod!=\"\"}[$__rate_interval])))"
        ),
        ["qosd_runqueue_latency_seconds_bucket"]
    );
    assert_eq!(
        metric_names(
            "sum(increase(a_total{x=\"y\"}[5m] offset 1m)) or 0 * sum(b) / on (instance) group_left (pod) c"
        ),
        ["a_total", "b", "c"]
    );
    assert_eq!(
        metric_names("topk(10, max without (cgroup) (d:recorded{le=\"1e-9\"})) > 1e-9"),
        ["d:recorded"]
    );
    assert_eq!(
        variables_used("rate(x{a=~\"$pod\", b=\"${namespace:regex}\"}[$__rate_interval])"),
        BTreeSet::from([
            "__rate_interval".to_owned(),
            "namespace".to_owned(),
            "pod".to_owned()
        ])
    );
    let exported = BTreeSet::from(["qosd_h_seconds".to_owned()]);
    assert!(is_exported("qosd_h_seconds_bucket", &exported));
    assert!(!is_exported("qosd_other_bucket", &exported));
}
