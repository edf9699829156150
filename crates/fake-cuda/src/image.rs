//! The module image the fake NVRTC produces and `cuModuleLoadData` accepts.
//!
//! A NUL-terminated text:
//! ```text
//! FAKECUDA-MODULE 1
//! arch <sm_NN | compute_NN | none>
//! entry <NAME> <NPARAMS>
//! ...
//! ```
//! one `entry` line per `extern "C" __global__` function, in source order. The `arch` is the
//! one given to `nvrtcCompileProgram` (`none` without one); `NN` may carry a letter suffix
//! (`sm_90a`). The same text is both the "PTX" and the "CUBIN" of a program.

use std::ffi::c_int;

/// The first line of every image.
pub const MAGIC: &[u8] = b"FAKECUDA-MODULE 1\n";

/// What an image holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The target architecture (`None`: none given).
    pub arch: Option<String>,
    /// Entry names and parameter counts.
    pub entries: Vec<(String, u32)>,
}

/// The version number `NN` of an architecture `sm_NN[x]` / `compute_NN[x]`, and whether it is
/// a real (`sm_`) target; `None` for anything else.
pub fn arch_version(arch: &str) -> Option<(u32, bool)> {
    let (rest, real) = if let Some(r) = arch.strip_prefix("sm_") {
        (r, true)
    } else {
        (arch.strip_prefix("compute_")?, false)
    };
    let digits = rest.trim_end_matches(|c: char| c.is_ascii_lowercase());
    let suffix = rest.len() - digits.len();
    if digits.len() < 2 || suffix > 1 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, real))
}

/// Whether a device of compute capability `cc` runs code for `arch` (`None`: any). The fake
/// only refuses code for a newer architecture than the device's (what both PTX and a cubin of
/// a real toolchain would refuse too).
pub fn runs_on(arch: Option<&str>, cc: (c_int, c_int)) -> bool {
    let Some((v, _)) = arch.and_then(arch_version) else {
        return true;
    };
    let have = i64::from(cc.0) * 10 + i64::from(cc.1);
    i64::from(v) <= have
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
        for (name, n) in &self.entries {
            s.push_str(&format!("entry {name} {n}\n"));
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
        let mut entries: Vec<(String, u32)> = Vec::new();
        for line in lines {
            let mut words = line.strip_prefix("entry ")?.split(' ');
            let (name, n) = (words.next()?, words.next()?.parse::<u32>().ok()?);
            if words.next().is_some() || !identifier(name) || entries.iter().any(|(e, _)| e == name)
            {
                return None;
            }
            entries.push((name.to_string(), n));
        }
        Some(Image { arch, entries })
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
            entries: vec![("k".into(), 2), ("scale_f32".into(), 0)],
        };
        let bytes = img.render();
        assert_eq!(bytes.last(), Some(&0));
        let text = &bytes[..bytes.len() - 1];
        assert_eq!(
            text,
            b"FAKECUDA-MODULE 1\narch sm_90a\nentry k 2\nentry scale_f32 0\n"
        );
        assert_eq!(Image::parse(text), Some(img));
        // SAFETY: `bytes` is NUL-terminated.
        assert!(unsafe { Image::read(bytes.as_ptr()) }.is_some());
        for bad in [
            &b"FAKECUDA-MODULE 2\narch none\n"[..],
            b"FAKECUDA-MODULE 1\nentry k 1\n",
            b"FAKECUDA-MODULE 1\narch sm_x\n",
            b"FAKECUDA-MODULE 1\narch none\nentry k\n",
            b"FAKECUDA-MODULE 1\narch none\nentry 9k 1\n",
            b"FAKECUDA-MODULE 1\narch none\nentry k 1\nentry k 2\n",
            b"FAKECUDA-MODULE 1\narch none\nkernel k 1\n",
        ] {
            assert_eq!(Image::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        // SAFETY: the first byte already differs from the magic.
        assert!(unsafe { Image::read(b"\x7fELF".as_ptr()) }.is_none());
        assert_eq!(arch_version("sm_86"), Some((86, true)));
        assert_eq!(arch_version("compute_100"), Some((100, false)));
        assert_eq!(arch_version("sm_9"), None);
        assert!(runs_on(Some("sm_86"), (9, 0)));
        assert!(!runs_on(Some("compute_90"), (8, 6)));
        assert!(runs_on(None, (5, 0)));
    }
}
