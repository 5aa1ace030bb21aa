//! Finds the line of a place (`nodes.respond.kind`) in a YAML or JSON source, so errors can
//! point at it. A parsed value keeps no positions; a forward scan over the text for each key
//! in turn, each deeper than the last, finds the line in the graph files people write.

/// One step of a place: a key or a list index.
#[derive(Debug, PartialEq)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

fn segments(place: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    for part in place.split('.') {
        let (key, rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            out.push(Seg::Key(key));
        }
        for idx in rest.split('[').filter(|s| !s.is_empty()) {
            if let Ok(n) = idx.trim_end_matches(']').parse() {
                out.push(Seg::Index(n));
            }
        }
    }
    out
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn is_key_line(trimmed: &str, key: &str) -> bool {
    let t = trimmed
        .trim_start_matches("- ")
        .trim_start_matches(['{', ' ']);
    let quoted = format!("\"{key}\"");
    let single = format!("'{key}'");
    for k in [key, quoted.as_str(), single.as_str()] {
        if let Some(rest) = t.strip_prefix(k) {
            if rest.trim_start().starts_with(':') {
                return true;
            }
        }
    }
    // Flow mappings: `{ from: a, to: b }` hold several keys on one line.
    t.contains(&format!(" {key}:"))
        || t.contains(&format!(",{key}:"))
        || t.contains(&format!("\"{key}\":"))
}

/// The 1-based line of `place` in `source`, when it can be found.
pub fn line_of(source: &str, place: &str) -> Option<usize> {
    let lines: Vec<&str> = source.lines().collect();
    let mut pos = 0usize;
    let mut min_indent: Option<usize> = None;
    let mut found = None;
    for seg in segments(place) {
        let mut hit = None;
        match seg {
            Seg::Key(key) => {
                for (i, line) in lines.iter().enumerate().skip(pos) {
                    let t = line.trim_start();
                    if t.is_empty() || t.starts_with('#') {
                        continue;
                    }
                    if let (Some(m), true) = (min_indent, found.is_some()) {
                        if indent(line) < m && i > pos {
                            break;
                        }
                    }
                    if is_key_line(t, key) {
                        hit = Some(i);
                        break;
                    }
                }
            }
            Seg::Index(n) => {
                let mut count = 0;
                for (i, line) in lines.iter().enumerate().skip(pos) {
                    let t = line.trim_start();
                    if t.starts_with("- ") || t == "-" || t.starts_with('{') {
                        if count == n {
                            hit = Some(i);
                            break;
                        }
                        count += 1;
                    }
                }
            }
        }
        match hit {
            Some(i) => {
                found = Some(i);
                min_indent = Some(indent(lines[i]) + 1);
                pos = if matches!(seg, Seg::Index(_)) {
                    i
                } else {
                    i + 1
                };
            }
            None => break,
        }
    }
    found.map(|i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_yaml_keys() {
        let src = "name: x\nnodes:\n  a:\n    kind: script\n  respond:\n    kind: modle\n";
        assert_eq!(line_of(src, "nodes.respond.kind"), Some(6));
        assert_eq!(line_of(src, "nodes.a"), Some(3));
    }

    #[test]
    fn finds_list_items() {
        let src = "edges:\n  - {from: a, to: b}\n  - {from: b, to: zz}\n";
        assert_eq!(line_of(src, "edges[1].to"), Some(3));
    }

    #[test]
    fn finds_json_keys() {
        let src = "{\n  \"nodes\": {\n    \"respond\": {\n      \"kind\": \"x\"\n    }\n  }\n}";
        assert_eq!(line_of(src, "nodes.respond.kind"), Some(4));
    }
}
