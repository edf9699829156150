//! What the fake NVRTC "compiles": options, `#error` directives and `extern "C" __global__`
//! entries of a source.

use crate::image::arch_version;

/// The architecture the options ask for (`None`: none given), or the log of a bad option.
///
/// Recognized: `--gpu-architecture=X`, `--gpu-architecture X`, `-arch=X`, `-arch X` (as two
/// options or one); `X` must be `sm_NN` or `compute_NN` (with an optional letter suffix). Any
/// other option starting with `-` is accepted and ignored; one that does not is invalid.
pub fn parse_options(opts: &[String]) -> Result<Option<String>, String> {
    let mut arch = None;
    let mut it = opts.iter();
    while let Some(opt) = it.next() {
        let value = if opt == "-arch" || opt == "--gpu-architecture" {
            match it.next() {
                Some(v) => v.trim().to_string(),
                None => return Err(format!("error: option '{opt}' needs a value\n")),
            }
        } else if let Some(v) = ["--gpu-architecture=", "-arch=", "-arch "]
            .iter()
            .find_map(|p| opt.strip_prefix(p))
        {
            v.trim().to_string()
        } else if opt.starts_with('-') {
            continue;
        } else {
            return Err(format!("error: unrecognized option '{opt}'\n"));
        };
        if arch_version(&value).is_none() {
            return Err(format!(
                "error: invalid value '{value}' for option '--gpu-architecture' (-arch)\n"
            ));
        }
        arch = Some(value);
    }
    Ok(arch)
}

/// `src` with its comments blanked (newlines kept, so line numbers stay right); string and
/// character literals are kept as they are.
fn strip_comments(src: &str) -> String {
    #[derive(PartialEq)]
    enum Mode {
        Code,
        Line,
        Block,
        Quoted(char),
    }
    let mut out = String::with_capacity(src.len());
    let mut mode = Mode::Code;
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        match mode {
            Mode::Code => match (c, chars.peek()) {
                ('/', Some('/')) => {
                    chars.next();
                    out.push_str("  ");
                    mode = Mode::Line;
                }
                ('/', Some('*')) => {
                    chars.next();
                    out.push_str("  ");
                    mode = Mode::Block;
                }
                ('"' | '\'', _) => {
                    out.push(c);
                    mode = Mode::Quoted(c);
                }
                _ => out.push(c),
            },
            Mode::Line => {
                if c == '\n' {
                    out.push('\n');
                    mode = Mode::Code;
                } else {
                    out.push(' ');
                }
            }
            Mode::Block => {
                if c == '*' && chars.peek() == Some(&'/') {
                    chars.next();
                    out.push_str("  ");
                    mode = Mode::Code;
                } else {
                    out.push(if c == '\n' { '\n' } else { ' ' });
                }
            }
            Mode::Quoted(q) => {
                out.push(c);
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        out.push(n);
                    }
                } else if c == q || c == '\n' {
                    mode = Mode::Code;
                }
            }
        }
    }
    out
}

/// The directive of a preprocessor line (`#  error x` -> `error x`), if it is one.
fn directive(line: &str) -> Option<&str> {
    Some(line.trim_start().strip_prefix('#')?.trim_start())
}

#[derive(Debug, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    Punct(char),
}

/// The tokens of `code` (comments already blanked), preprocessor lines skipped.
fn tokens(code: &str) -> Vec<Tok> {
    let mut toks = Vec::new();
    for line in code.lines().filter(|l| directive(l).is_none()) {
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if c.is_whitespace() {
                continue;
            }
            if c == '_' || c.is_ascii_alphanumeric() {
                let mut w = String::from(c);
                while let Some(&n) = chars
                    .peek()
                    .filter(|n| **n == '_' || n.is_ascii_alphanumeric())
                {
                    w.push(n);
                    chars.next();
                }
                toks.push(Tok::Word(w));
            } else if c == '"' {
                let mut s = String::new();
                while let Some(n) = chars.next() {
                    match n {
                        '"' => break,
                        '\\' => s.extend(chars.next()),
                        _ => s.push(n),
                    }
                }
                toks.push(Tok::Str(s));
            } else {
                toks.push(Tok::Punct(c));
            }
        }
    }
    toks
}

fn word(t: Option<&Tok>, w: &str) -> bool {
    matches!(t, Some(Tok::Word(x)) if x == w)
}

/// The index just past the group opened by the `(` at `open`, and the tokens inside it.
fn group(toks: &[Tok], open: usize) -> Option<(usize, &[Tok])> {
    if toks.get(open) != Some(&Tok::Punct('(')) {
        return None;
    }
    let mut depth = 0usize;
    for (i, t) in toks.iter().enumerate().skip(open) {
        match t {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') => {
                depth -= 1;
                if depth == 0 {
                    return Some((i + 1, &toks[open + 1..i]));
                }
            }
            _ => {}
        }
    }
    None
}

/// Skips a `__launch_bounds__(...)` at `i`, if there is one.
fn skip_bounds(toks: &[Tok], i: usize) -> Option<usize> {
    if word(toks.get(i), "__launch_bounds__") {
        group(toks, i + 1).map(|(end, _)| end)
    } else {
        Some(i)
    }
}

/// The number of parameters of a parameter list: top-level commas + 1; `()` and `(void)` are 0.
fn count_params(inner: &[Tok]) -> u32 {
    if inner.is_empty() || (inner.len() == 1 && word(inner.first(), "void")) {
        return 0;
    }
    let mut depth = 0i32;
    let mut commas = 0;
    for t in inner {
        match t {
            Tok::Punct('(' | '[' | '{' | '<') => depth += 1,
            Tok::Punct(')' | ']' | '}' | '>') => depth -= 1,
            Tok::Punct(',') if depth == 0 => commas += 1,
            _ => {}
        }
    }
    commas + 1
}

/// The entry declared at `i` (`extern "C" __global__ [__launch_bounds__(..)] void
/// [__launch_bounds__(..)] NAME(PARAMS)`), if one is.
fn entry_at(toks: &[Tok], i: usize) -> Option<(String, u32)> {
    if !word(toks.get(i), "extern") || toks.get(i + 1) != Some(&Tok::Str("C".into())) {
        return None;
    }
    if !word(toks.get(i + 2), "__global__") {
        return None;
    }
    let j = skip_bounds(toks, i + 3)?;
    if !word(toks.get(j), "void") {
        return None;
    }
    let j = skip_bounds(toks, j + 1)?;
    let Some(Tok::Word(name)) = toks.get(j) else {
        return None;
    };
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let (_, inner) = group(toks, j + 1)?;
    Some((name.clone(), count_params(inner)))
}

/// "Compiles" program `name`: its entries and parameter counts, in source order, or the log of
/// a failed compile (an `#error` directive, a duplicate entry, no entry at all).
pub fn compile(name: &str, src: &str) -> Result<Vec<(String, u32)>, String> {
    let code = strip_comments(src);
    for (n, line) in code.lines().enumerate() {
        if let Some(msg) = directive(line).and_then(|d| d.strip_prefix("error")) {
            if msg.is_empty() || msg.starts_with(char::is_whitespace) {
                let line_no = n + 1;
                let msg = msg.trim();
                return Err(format!(
                    "{name}({line_no}): catastrophic error: #error directive: {msg}\n\n\
                     1 catastrophic error detected in the compilation of \"{name}\".\n\
                     Compilation terminated.\n"
                ));
            }
        }
    }
    let toks = tokens(&code);
    let mut entries: Vec<(String, u32)> = Vec::new();
    for i in 0..toks.len() {
        if let Some((entry, n)) = entry_at(&toks, i) {
            if entries.iter().any(|(e, _)| *e == entry) {
                return Err(format!(
                    "{name}: error: function \"{entry}\" has already been defined\n"
                ));
            }
            entries.push((entry, n));
        }
    }
    if entries.is_empty() {
        return Err(format!(
            "{name}: error: no extern \"C\" __global__ function found (the fake NVRTC needs at \
             least one entry)\n"
        ));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_params_comments_and_errors() {
        let src = r#"
            // extern "C" __global__ void commented(int a) {}
            /* extern "C" __global__ void
               blocked(int a) {} */
            #include <cuda_fp16.h>
            template <typename T> __device__ T twice(T x) { return x + x; }
            extern   "C"
            __global__ void
            add(const float* __restrict__ a, const float *b, float* out, unsigned long long n) {
                const char* s = "// not a comment";
            }
            extern "C" __global__ __launch_bounds__(256, 2) void none(void) {}
            extern "C" __global__ void __launch_bounds__(128) empty() {}
            extern "C" __global__ void tmpl(Pair<int, float> p, int (*f)(int, int)) {}
            __global__ void not_extern(int a) {}
        "#;
        assert_eq!(
            compile("p.cu", src).unwrap(),
            [
                ("add".to_string(), 4),
                ("none".to_string(), 0),
                ("empty".to_string(), 0),
                ("tmpl".to_string(), 2),
            ]
        );
        let err = compile("p.cu", "int x;\n  #  error  too old  \n").unwrap_err();
        assert!(
            err.starts_with("p.cu(2): catastrophic error: #error directive: too old\n"),
            "{err}"
        );
        assert!(compile("p.cu", "// #error no\n")
            .unwrap_err()
            .contains("no extern"));
        assert!(compile("p.cu", "__global__ void k() {}").is_err());
        let dup = "extern \"C\" __global__ void k() {}\nextern \"C\" __global__ void k(int a) {}";
        assert!(compile("p.cu", dup)
            .unwrap_err()
            .contains("already been defined"));
    }

    #[test]
    fn options() {
        let o = |v: &[&str]| parse_options(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(o(&[]), Ok(None));
        assert_eq!(o(&["-arch=sm_90", "-lineinfo"]), Ok(Some("sm_90".into())));
        assert_eq!(o(&["-arch", "compute_86"]), Ok(Some("compute_86".into())));
        assert_eq!(o(&["-arch sm_80"]), Ok(Some("sm_80".into())));
        assert_eq!(o(&["--gpu-architecture=sm_90a"]), Ok(Some("sm_90a".into())));
        assert!(o(&["-arch=gfx90a"]).is_err());
        assert!(o(&["-arch"]).is_err());
        assert!(o(&["O3"]).is_err());
    }
}
