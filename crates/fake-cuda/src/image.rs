//! The module image the fake NVRTC produces and `cuModuleLoadData` accepts.
//!
//! A NUL-terminated text:
//! ```text
//! FAKECUDA-MODULE 1
//! arch <sm_NN | compute_NN | none>
//! cuda <MAJOR>.<MINOR>
//! entry <NAME> <NPARAMS> [<MAXTHREADS>]
//! ...
//! ```
//! one `entry` line per `extern "C" __global__` function, in source order, with the first
//! argument of its `__launch_bounds__` when it has one. The `arch` is the one given to
//! `nvrtcCompileProgram` (`none` without one); `NN` may carry an `a` (architecture-specific) or
//! `f` (family-specific) suffix (`sm_90a`). The `cuda` line is the version of the NVRTC that
//! compiled it; an image without one (written by hand) has no known version. The same text is
//! both the "PTX" and the "CUBIN" of a program.

use std::ffi::c_int;

/// The first line of every image.
pub const MAGIC: &[u8] = b"FAKECUDA-MODULE 1\n";

/// One `extern "C" __global__` function of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// Its parameter count.
    pub params: u32,
    /// The first argument of its `__launch_bounds__`, when it has one.
    pub max_threads: Option<u32>,
}

impl Entry {
    pub fn new(name: &str, params: u32, max_threads: Option<u32>) -> Entry {
        Entry {
            name: name.to_string(),
            params,
            max_threads,
        }
    }
}

/// What an image holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The target architecture (`None`: none given).
    pub arch: Option<String>,
    /// The version (major, minor) of the NVRTC that made it (`None`: unknown).
    pub cuda: Option<(u32, u32)>,
    pub entries: Vec<Entry>,
}

/// A parsed architecture name: `sm_NN[x]` (a real target, a cubin) or `compute_NN[x]` (a
/// virtual one, PTX).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    /// `NN`: the compute capability times ten (`90`, `100`, `121`).
    pub number: u32,
    /// `sm_` (a cubin) rather than `compute_` (PTX).
    pub real: bool,
    /// `a` (architecture-specific), `f` (family-specific) or none.
    pub suffix: Option<char>,
}

/// Parses `sm_NN[a|f]` / `compute_NN[a|f]`; `None` for anything else.
pub fn parse_arch(arch: &str) -> Option<Arch> {
    let (rest, real) = if let Some(r) = arch.strip_prefix("sm_") {
        (r, true)
    } else {
        (arch.strip_prefix("compute_")?, false)
    };
    let (digits, suffix) = match rest.strip_suffix(['a', 'f']) {
        Some(d) => (d, rest.chars().last()),
        None => (rest, None),
    };
    if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Arch {
        number: digits.parse().ok()?,
        real,
        suffix,
    })
}

/// The version number `NN` of an architecture `sm_NN[x]` / `compute_NN[x]`, and whether it is
/// a real (`sm_`) target; `None` for anything else.
pub fn arch_version(arch: &str) -> Option<(u32, bool)> {
    parse_arch(arch).map(|a| (a.number, a.real))
}

/// Whether a device of compute capability `cc` runs code for `arch` (`None`: any), as the CUDA
/// C++ Programming Guide's "Binary Compatibility" and "PTX Compatibility" say: a cubin `sm_NN`
/// runs only on a device of the same major capability and at least `NN` (`sm_80` on 8.6, never
/// on 9.0); PTX `compute_NN` on any device of at least `NN` (the driver compiles it); an `a`
/// suffix (`sm_90a`, `compute_90a`) only on exactly that capability; an `f` suffix (family
/// code) on the same major capability and at least `NN`, cubin or PTX.
pub fn runs_on(arch: Option<&str>, cc: (c_int, c_int)) -> bool {
    let Some(a) = arch.and_then(parse_arch) else {
        return true;
    };
    let have = i64::from(cc.0) * 10 + i64::from(cc.1);
    let (want, major) = (i64::from(a.number), i64::from(a.number / 10));
    match (a.real, a.suffix) {
        (_, Some('a')) => want == have,
        (true, _) | (false, Some(_)) => major == i64::from(cc.0) && want <= have,
        (false, None) => want <= have,
    }
}

/// What keeps a driver of version `driver` (major, minor) from loading an image made by NVRTC
/// `cuda` (`None`: unknown, never refused) for `arch`: PTX (a `compute_` target, or none) newer
/// than the driver (by major.minor) is an unsupported PTX version; a cubin of a newer major
/// version too, while a newer minor version of the same major loads (minor version
/// compatibility, CUDA Compatibility guide).
pub fn too_new(cuda: Option<(u32, u32)>, arch: Option<&str>, driver: (u32, u32)) -> bool {
    let Some(made) = cuda else {
        return false;
    };
    let cubin = arch.and_then(parse_arch).is_some_and(|a| a.real);
    if cubin {
        made.0 > driver.0
    } else {
        made > driver
    }
}

fn identifier(s: &str) -> bool {
    let mut b = s.bytes();
    b.next()
        .is_some_and(|c| c == b'_' || c.is_ascii_alphabetic())
        && b.all(|c| c == b'_' || c.is_ascii_alphanumeric())
}

impl Image {
    /// The image text, NUL-terminated.
    pub fn render(&self) -> Vec<u8> {
        let mut s = String::from_utf8_lossy(MAGIC).into_owned();
        s.push_str(&format!(
            "arch {}\n",
            self.arch.as_deref().unwrap_or("none")
        ));
        if let Some((major, minor)) = self.cuda {
            s.push_str(&format!("cuda {major}.{minor}\n"));
        }
        for e in &self.entries {
            s.push_str(&format!("entry {} {}", e.name, e.params));
            if let Some(t) = e.max_threads {
                s.push_str(&format!(" {t}"));
            }
            s.push('\n');
        }
        let mut v = s.into_bytes();
        v.push(0);
        v
    }

    /// Parses an image text (without its NUL); `None` when it is not a valid image.
    pub fn parse(text: &[u8]) -> Option<Image> {
        let body = std::str::from_utf8(text.strip_prefix(MAGIC)?).ok()?;
        let mut lines = body.lines();
        let arch = match lines.next()?.strip_prefix("arch ")? {
            "none" => None,
            a => {
                arch_version(a)?;
                Some(a.to_string())
            }
        };
        let mut lines = lines.peekable();
        let cuda = match lines.peek().and_then(|l| l.strip_prefix("cuda ")) {
            Some(v) => {
                let (a, b) = v.split_once('.')?;
                lines.next();
                Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?))
            }
            None => None,
        };
        let mut entries: Vec<Entry> = Vec::new();
        for line in lines {
            let mut words = line.strip_prefix("entry ")?.split(' ');
            let (name, n) = (words.next()?, words.next()?.parse::<u32>().ok()?);
            let max_threads = match words.next() {
                Some(t) => Some(t.parse::<u32>().ok().filter(|&t| t > 0)?),
                None => None,
            };
            if words.next().is_some() || !identifier(name) || entries.iter().any(|e| e.name == name)
            {
                return None;
            }
            entries.push(Entry::new(name, n, max_threads));
        }
        Some(Image {
            arch,
            cuda,
            entries,
        })
    }

    /// Reads and parses the image at `p`: compares the magic byte by byte (so a binary that is
    /// no image, e.g. a real cubin, is never read past its first differing byte), then reads
    /// up to the NUL.
    ///
    /// # Safety
    /// `p` must be non-null and readable up to its first byte differing from [`MAGIC`] and, if
    /// it starts with the magic, up to a NUL.
    pub unsafe fn read(p: *const u8) -> Option<Image> {
        for (i, &m) in MAGIC.iter().enumerate() {
            // SAFETY: every byte before `i` matched the magic (none is NUL), so byte `i` is
            // readable per the caller.
            if unsafe { *p.add(i) } != m {
                return None;
            }
        }
        // SAFETY: the magic matched, so the caller vouches for a NUL-terminated text.
        let text = unsafe { std::ffi::CStr::from_ptr(p.cast()) };
        Image::parse(text.to_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_round_trip_and_odd_ones_are_refused() {
        let img = Image {
            arch: Some("sm_90a".into()),
            cuda: Some((12, 8)),
            entries: vec![
                Entry::new("k", 2, Some(256)),
                Entry::new("scale_f32", 0, None),
            ],
        };
        let bytes = img.render();
        assert_eq!(bytes.last(), Some(&0));
        let text = &bytes[..bytes.len() - 1];
        assert_eq!(
            text,
            b"FAKECUDA-MODULE 1\narch sm_90a\ncuda 12.8\nentry k 2 256\nentry scale_f32 0\n"
        );
        assert_eq!(Image::parse(text), Some(img));
        // SAFETY: `bytes` is NUL-terminated.
        assert!(unsafe { Image::read(bytes.as_ptr()) }.is_some());
        let old = Image::parse(b"FAKECUDA-MODULE 1\narch sm_90\nentry k 1\n").unwrap();
        assert_eq!((old.cuda, old.entries[0].max_threads), (None, None));
        for bad in [
            &b"FAKECUDA-MODULE 2\narch none\n"[..],
            b"FAKECUDA-MODULE 1\nentry k 1\n",
            b"FAKECUDA-MODULE 1\narch sm_x\n",
            b"FAKECUDA-MODULE 1\narch sm_90b\n",
            b"FAKECUDA-MODULE 1\narch none\nentry k\n",
            b"FAKECUDA-MODULE 1\narch none\nentry 9k 1\n",
            b"FAKECUDA-MODULE 1\narch none\nentry k 1\nentry k 2\n",
            b"FAKECUDA-MODULE 1\narch none\nentry k 1 0\n",
            b"FAKECUDA-MODULE 1\narch none\nentry k 1 2 3\n",
            b"FAKECUDA-MODULE 1\narch none\ncuda 13\n",
            b"FAKECUDA-MODULE 1\narch none\nentry k 1\ncuda 13.0\n",
            b"FAKECUDA-MODULE 1\narch none\nkernel k 1\n",
        ] {
            assert_eq!(Image::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        // SAFETY: the first byte already differs from the magic.
        assert!(unsafe { Image::read(b"\x7fELF".as_ptr()) }.is_none());
        assert_eq!(arch_version("sm_86"), Some((86, true)));
        assert_eq!(arch_version("compute_100"), Some((100, false)));
        assert_eq!(arch_version("sm_9"), None);
        let f = parse_arch("compute_100f").unwrap();
        assert_eq!((f.number, f.real, f.suffix), (100, false, Some('f')));
    }

    #[test]
    fn architectures_load_where_cuda_runs_them() {
        let on = |arch: &str, cc| runs_on(Some(arch), cc);
        // A cubin: the same major capability, not newer.
        assert!(on("sm_80", (8, 6)) && on("sm_86", (8, 6)) && on("sm_90", (9, 0)));
        assert!(!on("sm_80", (9, 0)) && !on("sm_86", (8, 0)) && !on("sm_90", (10, 0)));
        // PTX: any device at least as new (the driver JIT-compiles it).
        assert!(on("compute_80", (9, 0)) && on("compute_52", (12, 0)));
        assert!(!on("compute_90", (8, 6)));
        // Architecture-specific: exactly that capability.
        assert!(on("sm_90a", (9, 0)) && on("compute_90a", (9, 0)));
        assert!(!on("sm_90a", (10, 0)) && !on("compute_90a", (10, 0)));
        // Family-specific: the same major capability, at least as new.
        assert!(on("sm_100f", (10, 3)) && on("compute_100f", (10, 3)));
        assert!(!on("compute_100f", (12, 0)) && !on("sm_103f", (10, 0)));
        assert!(runs_on(None, (5, 0)));
        // Versions: PTX by major.minor, a cubin by major only; unknown never refused.
        assert!(too_new(Some((12, 8)), Some("compute_90"), (12, 4)));
        assert!(!too_new(Some((12, 8)), Some("sm_90"), (12, 4)));
        assert!(too_new(Some((13, 0)), Some("sm_90"), (12, 9)));
        assert!(too_new(Some((12, 5)), None, (12, 4)));
        assert!(!too_new(Some((12, 4)), Some("compute_90"), (12, 4)));
        assert!(!too_new(None, Some("compute_90"), (11, 0)));
    }
}
