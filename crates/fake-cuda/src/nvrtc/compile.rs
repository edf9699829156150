//! What the fake NVRTC "compiles": options, `#error` directives and `extern "C" __global__`
//! entries of a source, with their `__launch_bounds__`.

use crate::image::{parse_arch, Entry};

/// The log line NVRTC writes for a `--gpu-architecture` value it does not support.
pub const BAD_ARCH: &str = "nvrtc error: invalid value for --gpu-architecture (-arch)\n";

/// The architectures (`NN` of `sm_NN` / `compute_NN`) NVRTC `version` compiles for, ascending:
/// 12.0 to 12.7 from 5.0 to 9.0; 12.8 and later 12.x add 10.0, 10.1 and 12.0; 13.x drops
/// everything before 7.5 and adds 8.8, 10.3, 11.0 and 12.1 (10.1 became 11.0). Versions before
/// 12 answer 12.0's list, after 13 13.x's.
pub fn supported_archs(version: (i32, i32)) -> &'static [i32] {
    const V12: &[i32] = &[50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
    const V12_8: &[i32] = &[
        50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 120,
    ];
    const V13: &[i32] = &[75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];
    match version {
        (..=11, _) => V12,
        (12, ..=7) => V12,
        (12, _) => V12_8,
        _ => V13,
    }
}

/// The architecture the options ask for (`None`: none given), or the log of a bad option.
///
/// Recognized: `--gpu-architecture=X`, `--gpu-architecture X`, `-arch=X`, `-arch X` (as two
/// options or one); `X` must be `sm_NN` or `compute_NN` (with an optional `a` or `f` suffix)
/// whose `NN` is one of `archs` (NVRTC's [`supported_archs`]), else the log is [`BAD_ARCH`].
/// Any other option starting with `-` is accepted and ignored; one that does not is invalid.
pub fn parse_options(opts: &[String], archs: &[i32]) -> Result<Option<String>, String> {
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
        let known = parse_arch(&value)
            .and_then(|a| i32::try_from(a.number).ok())
            .is_some_and(|n| archs.contains(&n));
        if !known {
            return Err(BAD_ARCH.to_string());
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

/// An integer literal's value (`256`, `0x100`, `256u`); `None` for anything else.
fn integer(w: &str) -> Option<u32> {
    let w = w.trim_end_matches(['u', 'U', 'l', 'L']);
    match w.strip_prefix("0x").or_else(|| w.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None if w.bytes().all(|b| b.is_ascii_digit()) => w.parse().ok(),
        None => None,
    }
}

/// The integer a name stands for in `code`: `#define NAME N` or `[static] constexpr/const TYPE
/// NAME = N;` with an integer literal `N` (the fake has no preprocessor or constant folding).
fn constant(code: &str, toks: &[Tok], name: &str) -> Option<u32> {
    let defined = code.lines().find_map(|l| {
        let mut w = directive(l)?.strip_prefix("define")?.split_whitespace();
        (w.next()? == name).then(|| w.next().and_then(integer))?
    });
    defined.or_else(|| {
        toks.windows(4).find_map(|w| match w {
            [Tok::Word(n), Tok::Punct('='), Tok::Word(v), Tok::Punct(';')] if n == name => {
                integer(v)
            }
            _ => None,
        })
    })
}

/// What is at `i`: past a `__launch_bounds__(...)` there, with the value of its first argument
/// (`Err` with the log when the fake cannot tell it), or `i` itself without one.
fn bounds(code: &str, toks: &[Tok], i: usize) -> Option<Result<(usize, Option<u32>), String>> {
    if !word(toks.get(i), "__launch_bounds__") {
        return Some(Ok((i, None)));
    }
    let (end, inner) = group(toks, i + 1)?;
    let first: Vec<&Tok> = inner
        .iter()
        .take_while(|t| **t != Tok::Punct(','))
        .collect();
    let value = match first.as_slice() {
        [Tok::Word(w)] => integer(w).or_else(|| constant(code, toks, w)),
        _ => None,
    };
    Some(match value {
        Some(n) if n > 0 => Ok((end, Some(n))),
        _ => Err(format!(
            "error: the fake NVRTC reads the first argument of __launch_bounds__ only as an \
             integer literal, or a name given one by #define or a constexpr/const \
             initializer: {first:?}\n"
        )),
    })
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
/// [__launch_bounds__(..)] NAME(PARAMS)`), if one is; `Err` with the log for a
/// `__launch_bounds__` the fake cannot read.
fn entry_at(code: &str, toks: &[Tok], i: usize) -> Option<Result<Entry, String>> {
    if !word(toks.get(i), "extern") || toks.get(i + 1) != Some(&Tok::Str("C".into())) {
        return None;
    }
    if !word(toks.get(i + 2), "__global__") {
        return None;
    }
    let (j, before) = match bounds(code, toks, i + 3)? {
        Ok(b) => b,
        Err(log) => return Some(Err(log)),
    };
    if !word(toks.get(j), "void") {
        return None;
    }
    let (j, after) = match bounds(code, toks, j + 1)? {
        Ok(b) => b,
        Err(log) => return Some(Err(log)),
    };
    let Some(Tok::Word(name)) = toks.get(j) else {
        return None;
    };
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let (_, inner) = group(toks, j + 1)?;
    Some(Ok(Entry::new(name, count_params(inner), before.or(after))))
}

/// "Compiles" program `name`: its entries (parameter counts, launch bounds), in source order,
/// or the log of a failed compile (an `#error` directive, a duplicate entry, no entry at all, a
/// `__launch_bounds__` the fake cannot read).
pub fn compile(name: &str, src: &str) -> Result<Vec<Entry>, String> {
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
    let mut entries: Vec<Entry> = Vec::new();
    for i in 0..toks.len() {
        if let Some(found) = entry_at(&code, &toks, i) {
            let entry = found.map_err(|log| format!("{name}: {log}"))?;
            if entries.iter().any(|e| e.name == entry.name) {
                return Err(format!(
                    "{name}: error: function \"{}\" has already been defined\n",
                    entry.name
                ));
            }
            entries.push(entry);
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
                Entry::new("add", 4, None),
                Entry::new("none", 0, Some(256)),
                Entry::new("empty", 0, Some(128)),
                Entry::new("tmpl", 2, None),
            ]
        );
        let named = "#define BLOCK 0x80\nconstexpr unsigned int WIDE = 512u;\n\
            extern \"C\" __global__ void __launch_bounds__(BLOCK, 4) a() {}\n\
            extern \"C\" __global__ __launch_bounds__(WIDE) void b(int x) {}\n";
        assert_eq!(
            compile("p.cu", named).unwrap(),
            [Entry::new("a", 0, Some(128)), Entry::new("b", 1, Some(512))]
        );
        let unknown = "extern \"C\" __global__ void __launch_bounds__(N * 2) k() {}";
        assert!(compile("p.cu", unknown)
            .unwrap_err()
            .contains("first argument of __launch_bounds__"));
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
        let archs = supported_archs((13, 0));
        let o =
            |v: &[&str]| parse_options(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>(), archs);
        assert_eq!(o(&[]), Ok(None));
        assert_eq!(o(&["-arch=sm_90", "-lineinfo"]), Ok(Some("sm_90".into())));
        assert_eq!(o(&["-arch", "compute_86"]), Ok(Some("compute_86".into())));
        assert_eq!(o(&["-arch sm_80"]), Ok(Some("sm_80".into())));
        assert_eq!(o(&["--gpu-architecture=sm_90a"]), Ok(Some("sm_90a".into())));
        assert_eq!(o(&["-arch=gfx90a"]), Err(BAD_ARCH.to_string()));
        assert_eq!(
            o(&["-arch=sm_70"]),
            Err(BAD_ARCH.to_string()),
            "not in 13.0"
        );
        assert_eq!(o(&["-arch=sm_100f"]), Ok(Some("sm_100f".into())));
        assert_eq!(o(&["-arch=sm_90x"]), Err(BAD_ARCH.to_string()));
        assert!(o(&["-arch"]).is_err());
        assert!(o(&["O3"]).is_err());
    }

    #[test]
    fn supported_architectures_follow_the_version() {
        assert_eq!(supported_archs((12, 4)).first(), Some(&50));
        assert_eq!(supported_archs((12, 4)).last(), Some(&90));
        assert_eq!(supported_archs((12, 8)).last(), Some(&120));
        assert!(supported_archs((12, 9)).contains(&101));
        assert_eq!(supported_archs((13, 0)).first(), Some(&75));
        assert!(supported_archs((13, 2)).contains(&110));
        for v in [(11, 8), (12, 0), (12, 8), (13, 0), (14, 0)] {
            let a = supported_archs(v);
            assert!(a.windows(2).all(|w| w[0] < w[1]), "{v:?} ascending");
        }
    }
}
