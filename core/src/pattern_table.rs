//! Pattern tables from TOML: `[[pattern]]` entries with `name`, `pattern` (text syntax),
//! optional `priority` and optional `check` naming a stock check; and the table lint.
//!
//! ```toml
//! [[pattern]]
//! name = "dnnl.conv2d_relu"
//! pattern = "relax.nn.relu(relax.nn.conv2d(_, _))"
//! priority = 10
//! check = "no_leaking_intermediates"
//! ```
//!
//! Errors name the file, line and column: a TOML error where TOML puts it, a pattern syntax
//! error at its character inside the `pattern` string, an unknown check with the valid names.

use crate::error::{Error, Pos, Result};
use crate::pattern::check::{STOCK_CHECKS, stock_check};
use crate::pattern::{PatNode, Pattern, parse_pattern};
use crate::transform::FusionPattern;
use serde::Deserialize;
use std::ops::Range;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    pattern: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: toml::Spanned<String>,
    pattern: toml::Spanned<String>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    check: Option<toml::Spanned<String>>,
}

/// Converts a byte offset of `src` into a 1-based line and column.
pub fn pos_of(src: &str, offset: usize) -> Pos {
    let offset = offset.min(src.len());
    let before = src.get(..offset).unwrap_or("");
    let line = before.matches('\n').count() as u32 + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
    Pos { line, col }
}

pub(crate) fn toml_error(file: &str, src: &str, e: &toml::de::Error) -> Error {
    let span = e.span().unwrap_or(0..0);
    Error::source(file, src, pos_of(src, span.start), e.message().to_string())
}

/// Parses a pattern table. Entries come back in file order (sort them with
/// [`crate::transform::sort_by_priority`]).
pub fn parse_pattern_table(src: &str, file: &str) -> Result<Vec<FusionPattern>> {
    let parsed: File = toml::from_str(src).map_err(|e| toml_error(file, src, &e))?;
    let mut out = Vec::new();
    for e in parsed.pattern {
        out.push(entry_to_pattern(
            src,
            file,
            &e.name,
            &e.pattern,
            e.priority,
            e.check.as_ref(),
        )?);
    }
    Ok(out)
}

/// Builds one table entry from its spanned TOML fields (shared with [`crate::config`]).
pub(crate) fn entry_to_pattern(
    src: &str,
    file: &str,
    name: &toml::Spanned<String>,
    pattern: &toml::Spanned<String>,
    priority: i32,
    check: Option<&toml::Spanned<String>>,
) -> Result<FusionPattern> {
    if name.get_ref().is_empty() {
        return Err(Error::source(
            file,
            src,
            pos_of(src, name.span().start),
            "a pattern name must not be empty",
        ));
    }
    let parsed = parse_in_string(src, file, pattern.get_ref(), pattern.span())?;
    let mut fp = FusionPattern::new(name.get_ref(), parsed).with_priority(priority);
    if let Some(c) = check {
        let check = stock_check(c.get_ref()).ok_or_else(|| {
            Error::source(
                file,
                src,
                pos_of(src, c.span().start),
                format!(
                    "unknown check `{}`; expected one of: {}",
                    c.get_ref(),
                    STOCK_CHECKS.join(", ")
                ),
            )
        })?;
        fp.check = Some(check);
    }
    Ok(fp)
}

/// Parses a pattern written as a TOML string, reporting errors at their place in the file.
fn parse_in_string(src: &str, file: &str, text: &str, span: Range<usize>) -> Result<Pattern> {
    parse_pattern(text).map_err(|e| match e.as_source() {
        Some(se) => {
            // Map the column inside the pattern to the file: find the pattern text in the raw
            // TOML string (basic strings without escapes map one to one).
            let raw = src.get(span.clone()).unwrap_or("");
            let start = raw
                .find(text.get(..1).unwrap_or(""))
                .map_or(span.start, |i| span.start + i);
            let char_off: usize = text
                .chars()
                .take(se.pos.col.saturating_sub(1) as usize)
                .map(char::len_utf8)
                .sum();
            let pos = if raw.contains(text) {
                pos_of(src, start + char_off)
            } else {
                pos_of(src, span.start)
            };
            Error::source(file, src, pos, format!("in pattern: {}", se.message))
        }
        None => e,
    })
}

/// A pattern-table finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LintFinding {
    /// `duplicate`, `shadowed`, `never-matches` or `unknown-op`.
    pub kind: &'static str,
    /// The entry that is affected.
    pub entry: String,
    /// The other entry involved.
    pub other: String,
    /// What is wrong.
    pub message: String,
}

/// Lints a table in application order: duplicate names, entries that can never fire
/// because an earlier entry matches everything they match (and so takes those ops first), and
/// parts of a pattern that can never match any IR: a call of a known op with a number of
/// arguments the op never takes (`relax.nn.relu()`, `relax.nn.conv2d(_, _, _, _, _, _, _)`),
/// or a shape constraint with a negative dim. (Under a `!`, such a part makes the negation
/// always true instead; it is reported all the same, as it is surely not what was meant.)
/// A call of an op outside fusebox's op set is reported as `unknown-op`: it matches only an
/// opaque op of that exact name (what TVM prints for ops fusebox does not know), so it is
/// most often a misspelling.
pub fn lint(table: &[FusionPattern]) -> Vec<LintFinding> {
    let mut out = Vec::new();
    for (i, e) in table.iter().enumerate() {
        let mut named = Vec::new();
        for (_, node) in e.pattern.nodes.iter() {
            if let PatNode::Call { op, .. } = node
                && crate::op::Op::signature(op).is_none()
                && !named.contains(op)
            {
                named.push(op.clone());
                out.push(LintFinding {
                    kind: "unknown-op",
                    entry: e.name.clone(),
                    other: e.name.clone(),
                    message: format!(
                        "`{}` names `{op}`, which is not in fusebox's op set: it matches only an \
                         opaque op of that name (check the spelling)",
                        e.name
                    ),
                });
            }
        }
        for why in never_matches(&e.pattern) {
            out.push(LintFinding {
                kind: "never-matches",
                entry: e.name.clone(),
                other: e.name.clone(),
                message: format!("`{}` can never match: {why}", e.name),
            });
        }
        if let Some(prev) = table[..i].iter().find(|p| p.name == e.name) {
            out.push(LintFinding {
                kind: "duplicate",
                entry: e.name.clone(),
                other: prev.name.clone(),
                message: format!("pattern name `{}` appears more than once", e.name),
            });
        }
        if let Some(prev) = table[..i]
            .iter()
            .find(|p| p.check.is_none() && subsumes(&p.pattern, &e.pattern))
        {
            out.push(LintFinding {
                kind: "shadowed",
                entry: e.name.clone(),
                other: prev.name.clone(),
                message: format!(
                    "`{}` can never fire: the earlier `{}` matches everything it matches",
                    e.name, prev.name
                ),
            });
        }
    }
    out
}

/// Why parts of `p` can never match (see [`lint`]), one reason per part, in node order.
fn never_matches(p: &Pattern) -> Vec<String> {
    use crate::ir::Dim;
    use crate::pattern::ShapeDim;
    let mut out = Vec::new();
    for (_, node) in p.nodes.iter() {
        match node {
            PatNode::Call {
                op, args, at_least, ..
            } => {
                let Some(sig) = crate::op::Op::signature(op) else {
                    continue;
                };
                let n = args.len();
                let plural = |k: usize| if k == 1 { "" } else { "s" };
                let takes = if sig.min_args == sig.max_args {
                    format!("{} argument{}", sig.min_args, plural(sig.min_args))
                } else {
                    format!("{} to {} arguments", sig.min_args, sig.max_args)
                };
                if n > sig.max_args {
                    out.push(format!(
                        "`{op}` takes {takes}, the pattern gives {n}{}",
                        if *at_least { " or more" } else { "" }
                    ));
                } else if n < sig.min_args && !at_least {
                    out.push(format!("`{op}` takes {takes}, the pattern gives {n}"));
                }
            }
            PatNode::Shape(_, dims) => {
                if let Some(d) = dims.iter().find_map(|d| match d {
                    ShapeDim::Dim(Dim::Static(v)) if *v < 0 => Some(*v),
                    _ => None,
                }) {
                    out.push(format!("the shape constraint has the negative dim {d}"));
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether `general` matches every expression `specific` matches, at the same root (a
/// conservative syntactic check: `false` when unsure).
pub fn subsumes(general: &Pattern, specific: &Pattern) -> bool {
    if !general.constraints().is_empty() {
        return false;
    }
    sub(general, general.root(), specific, specific.root(), 0)
}

fn sub(
    g: &Pattern,
    gi: crate::pattern::PatId,
    s: &Pattern,
    si: crate::pattern::PatId,
    depth: usize,
) -> bool {
    if depth > 64 {
        return false;
    }
    let d = depth + 1;
    match (g.node(gi), s.node(si)) {
        (PatNode::Wildcard, _) => true,
        (PatNode::Capture(_, a), _) => sub(g, *a, s, si, d),
        (_, PatNode::Capture(_, b)) => sub(g, gi, s, *b, d),
        (_, PatNode::Or(a, b)) => sub(g, gi, s, *a, d) && sub(g, gi, s, *b, d),
        (PatNode::Or(a, b), _) => sub(g, *a, s, si, d) || sub(g, *b, s, si, d),
        (_, PatNode::And(a, b)) => sub(g, gi, s, *a, d) || sub(g, gi, s, *b, d),
        (PatNode::DType(a, x), PatNode::DType(b, y)) => x == y && sub(g, *a, s, *b, d),
        (_, PatNode::DType(a, _)) | (_, PatNode::Shape(a, _)) => sub(g, gi, s, *a, d),
        (PatNode::Const, PatNode::Const) => true,
        (PatNode::Var(None), PatNode::Var(_)) => true,
        (PatNode::Var(Some(a)), PatNode::Var(Some(b))) => a == b,
        (
            PatNode::Call {
                op: go,
                args: ga,
                at_least: gl,
                attrs: gat,
            },
            PatNode::Call {
                op: so,
                args: sa,
                at_least: sl,
                attrs: sat,
            },
        ) => {
            go == so
                && gat.iter().all(|c| sat.contains(c))
                && (if *gl {
                    sa.len() >= ga.len()
                } else {
                    !*sl && sa.len() == ga.len()
                })
                && ga.iter().zip(sa).all(|(x, y)| sub(g, *x, s, *y, d))
        }
        (PatNode::Tuple(a), PatNode::Tuple(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| sub(g, *x, s, *y, d))
        }
        (PatNode::TupleGetItem(a, i), PatNode::TupleGetItem(b, j)) => {
            (i.is_none() || i == j) && sub(g, *a, s, *b, d)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_table_and_reports_positions() {
        let src = "[[pattern]]\nname = \"dnnl.conv2d_relu\"\npattern = \"relax.nn.relu(relax.nn.conv2d(_, _))\"\npriority = 3\ncheck = \"no_leaking_intermediates\"\n";
        let t = match parse_pattern_table(src, "p.toml") {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].priority, 3);
        assert!(t[0].check.is_some());
        let bad = "[[pattern]]\nname = \"x.y\"\npattern = \"relax.nn.relu(_\"\n";
        let e = parse_pattern_table(bad, "p.toml")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.starts_with("p.toml:3:27: in pattern: expected `,` or `)`"),
            "{e}"
        );
        let unknown = "[[pattern]]\nname = \"x.y\"\npattern = \"_\"\nflavour = 1\n";
        let e = parse_pattern_table(unknown, "p.toml")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("p.toml:4:1: unknown field `flavour`"), "{e}");
        let check = "[[pattern]]\nname = \"x.y\"\npattern = \"_\"\ncheck = \"nope\"\n";
        let e = parse_pattern_table(check, "p.toml")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("unknown check `nope`; expected one of: no_leaking_intermediates"),
            "{e}"
        );
    }

    #[test]
    fn lint_flags_patterns_that_can_never_match() {
        let src = r#"
[[pattern]]
name = "a.relu0"
pattern = "relax.nn.relu()"
[[pattern]]
name = "a.conv7"
pattern = "relax.nn.conv2d(_, _, _, _, _, _, _)"
[[pattern]]
name = "a.neg"
pattern = "relax.add(_, _) : [2, -1]"
[[pattern]]
name = "a.fine"
pattern = "relax.nn.relu(relax.nn.conv2d(_, _, ...)) : [?, 4]"
[[pattern]]
name = "a.typo"
pattern = "relax.nn.relux(relax.nn.relux(_))"
"#;
        let t = parse_pattern_table(src, "t.toml").unwrap_or_default();
        assert_eq!(t.len(), 5);
        let f: Vec<(&str, String)> = lint(&t).into_iter().map(|x| (x.kind, x.message)).collect();
        assert_eq!(
            f,
            vec![
                (
                    "never-matches",
                    "`a.relu0` can never match: `relax.nn.relu` takes 1 argument, the pattern gives 0"
                        .to_string()
                ),
                (
                    "never-matches",
                    "`a.conv7` can never match: `relax.nn.conv2d` takes 2 arguments, the pattern gives 7"
                        .to_string()
                ),
                (
                    "never-matches",
                    "`a.neg` can never match: the shape constraint has the negative dim -1"
                        .to_string()
                ),
                (
                    "unknown-op",
                    "`a.typo` names `relax.nn.relux`, which is not in fusebox's op set: it \
                     matches only an opaque op of that name (check the spelling)"
                        .to_string()
                ),
            ]
        );
    }

    #[test]
    fn lint_flags_duplicates_and_shadowed_entries() {
        let src = r#"
[[pattern]]
name = "a.conv2d"
pattern = "relax.nn.conv2d(_, _)"
[[pattern]]
name = "a.conv2d_relu"
pattern = "relax.nn.relu(relax.nn.conv2d(_, _))"
[[pattern]]
name = "a.any_relu"
pattern = "relax.nn.relu(_)"
[[pattern]]
name = "a.relu_of_conv"
pattern = "relax.nn.relu(relax.nn.conv2d(_, const))"
[[pattern]]
name = "a.conv2d"
pattern = "relax.nn.conv2d(_, const)"
"#;
        let t = parse_pattern_table(src, "t.toml").unwrap_or_default();
        let f = lint(&t);
        let kinds: Vec<(&str, &str, &str)> = f
            .iter()
            .map(|x| (x.kind, x.entry.as_str(), x.other.as_str()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("shadowed", "a.relu_of_conv", "a.conv2d_relu"),
                ("duplicate", "a.conv2d", "a.conv2d"),
                ("shadowed", "a.conv2d", "a.conv2d"),
            ]
        );
    }
}
