//! No two modules of a crate import each other. A module that names another's items
//! (`use crate::a::b::X`, `crate::a::f(..)`, `super::X`) depends on it; two sibling modules that
//! depend on each other are one module split in two, and neither can be read or changed alone.
//! A module and its ancestors are left out: a parent declares its children, and a child may use
//! what its parent shares. Each source file is a module; `mod x { .. }` blocks inside a file
//! count as that file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates of the workspace: their source roots.
const CRATES: &[&str] = &[
    "src",
    "hwmodels/src",
    "engine/prefetch/src",
    "engine/core/src",
    "engine/runtime/src",
    "engine/cpu/src",
    "sim/src",
    "sim/twin/src",
    "traces/src",
    "calibration/src",
];

/// Every `.rs` file under `dir`, with its module path (`a/b.rs` and `a/b/mod.rs` are `a::b`;
/// `lib.rs` and `main.rs` the root).
fn modules(dir: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(dir).unwrap().with_extension("");
            let mut path: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                path.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                path.pop();
            }
            out.insert(path, p);
        }
    }
    out
}

/// The source without comments (line, doc and nested block comments), string literals (raw
/// ones included) and character literals, so that paths quoted in prose do not count.
fn code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        // The hashes of a raw string starting here (r"..", r#".."#, br".."), if one does.
        let raw = (b[i] == b'r'
            && (i == 0 || !ident(b[i - 1]) || (b[i - 1] == b'b' && (i < 2 || !ident(b[i - 2])))))
        .then(|| b[i + 1..].iter().take_while(|&&c| c == b'#').count())
        .filter(|&h| b.get(i + 1 + h) == Some(&b'"'));
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw {
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            i += 2 + hashes;
            while i < b.len() && !b[i..].starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            // An escaped character literal: '\n', '\'', '\u{..}'.
            i += 2;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            // A one-character literal ('"', 'a'); a lifetime ('a) has no closing quote.
            i += 3;
            out.push_str("' '");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The paths of a use tree starting at `s` (after `crate::` or `super::`): `a::b::X`,
/// `a::{b, c::{d, e}}`, each expanded to its segments.
fn use_tree(s: &[u8], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
        if *i < s.len() && s[*i] == b'{' {
            *i += 1;
            loop {
                use_tree(s, i, path.clone(), out);
                while *i < s.len() && s[*i].is_ascii_whitespace() {
                    *i += 1;
                }
                match s.get(*i) {
                    Some(b',') => *i += 1,
                    Some(b'}') => {
                        *i += 1;
                        return;
                    }
                    _ => return,
                }
                while *i < s.len() && s[*i].is_ascii_whitespace() {
                    *i += 1;
                }
                if s.get(*i) == Some(&b'}') {
                    *i += 1;
                    return;
                }
            }
        }
        let start = *i;
        while *i < s.len() && (s[*i].is_ascii_alphanumeric() || s[*i] == b'_') {
            *i += 1;
        }
        if start == *i {
            out.push(path);
            return;
        }
        path.push(String::from_utf8_lossy(&s[start..*i]).into_owned());
        if s[*i..].starts_with(b"::") {
            *i += 2;
        } else {
            out.push(path);
            return;
        }
    }
}

/// The modules (of `mods`) that the file of module `me` names.
fn deps(me: &[String], text: &str, mods: &BTreeMap<Vec<String>, PathBuf>) -> BTreeSet<Vec<String>> {
    let src = code(text);
    let s = src.as_bytes();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let boundary = i == 0 || !(s[i - 1].is_ascii_alphanumeric() || s[i - 1] == b'_');
        if boundary && s[i..].starts_with(b"crate::") {
            i += "crate::".len();
            use_tree(s, &mut i, Vec::new(), &mut paths);
        } else if boundary && s[i..].starts_with(b"super::") {
            // `super` of a file's module is its parent (a `mod.rs` is the module itself).
            let mut base = me.to_vec();
            base.pop();
            i += "super::".len();
            while s[i..].starts_with(b"super::") {
                base.pop();
                i += "super::".len();
            }
            use_tree(s, &mut i, base, &mut paths);
        } else {
            i += 1;
        }
    }
    let mut out = BTreeSet::new();
    for p in paths {
        // The longest prefix of the path that is a module file.
        let hit = (0..=p.len())
            .rev()
            .map(|n| p[..n].to_vec())
            .find(|m| mods.contains_key(m));
        if let Some(m) = hit {
            let related = m.starts_with(me) || me.starts_with(&m);
            if !related {
                out.insert(m);
            }
        }
    }
    out
}

#[test]
fn no_two_modules_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut circles = Vec::new();
    for krate in CRATES {
        let mods = modules(&root.join(krate));
        assert!(!mods.is_empty(), "{krate} has no sources");
        let graph: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> = mods
            .iter()
            .map(|(m, p)| (m, deps(m, &std::fs::read_to_string(p).unwrap(), &mods)))
            .collect();
        for (a, da) in &graph {
            for b in da {
                if a.as_slice() < b.as_slice() && graph[b].contains(*a) {
                    circles.push(format!("{krate}: {} <-> {}", a.join("::"), b.join("::")));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "modules importing each other:\n{}",
        circles.join("\n")
    );
}

/// The scanner sees the paths a file names, grouped or inline, and not those in comments.
#[test]
fn the_scanner_reads_use_trees_and_inline_paths() {
    let mods: BTreeMap<Vec<String>, PathBuf> = [
        vec![],
        vec!["a".into()],
        vec!["b".into()],
        vec!["c".into()],
        vec!["d".into()],
    ]
    .into_iter()
    .map(|m| (m, PathBuf::new()))
    .collect();
    let text =
        "use crate::{a::X, b::{self, Y}};\n// crate::d::Z\nfn f() { crate::c::g(\"crate::d\") }";
    let got = deps(&["e".into()], text, &mods);
    let want: BTreeSet<Vec<String>> = [vec!["a".into()], vec!["b".into()], vec!["c".into()]]
        .into_iter()
        .collect();
    assert_eq!(got, want);
    // A sibling through super, and the parent left out.
    let got = deps(&["x".into(), "y".into()], "use super::{z::Q, R};", &{
        let mut m = mods.clone();
        m.insert(vec!["x".into()], PathBuf::new());
        m.insert(vec!["x".into(), "z".into()], PathBuf::new());
        m
    });
    assert_eq!(
        got,
        [vec!["x".to_string(), "z".into()]].into_iter().collect()
    );
}

/// Character literals, raw strings and nested comments hide nothing and add nothing.
#[test]
fn the_scanner_skips_literals_and_nested_comments() {
    let mods: BTreeMap<Vec<String>, PathBuf> = [vec![], vec!["a".into()], vec!["d".into()]]
        .into_iter()
        .map(|m| (m, PathBuf::new()))
        .collect();
    let text = r####"
        let q = '"'; let e = '\''; let raw = r#"crate::d::X "quoted""#;
        /* outer /* inner */ crate::d::Y */
        fn f<'s>(x: &'s str) -> &'s str { x }
        use crate::a::Z;
    "####;
    let got = deps(&["e".into()], text, &mods);
    assert_eq!(got, [vec!["a".to_string()]].into_iter().collect());
}
