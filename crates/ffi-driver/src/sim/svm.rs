//! The sim's mapping policy: which allocations `map_host` grants (the rest get a mirror).

/// Which allocations `map_host` grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SvmPolicy {
    /// Every allocation can be mapped.
    Always,
    /// No allocation can be mapped (every host view is a mirror).
    Never,
    /// Allocations of at least this many bytes can be mapped; smaller ones are refused with
    /// NOT_SUPPORT, as on 64 KiB-page hosts where only huge-page allocations are mappable.
    MinBytes(u64),
}

impl SvmPolicy {
    /// Parses `"always"`, `"never"` or a minimum byte count (the one parser of the option:
    /// the Python `Worker(svm=...)` and the runners' `--svm` both come here).
    pub fn parse(s: &str) -> Result<SvmPolicy, String> {
        match s.trim() {
            "always" => Ok(SvmPolicy::Always),
            "never" => Ok(SvmPolicy::Never),
            n => n.parse().map(SvmPolicy::MinBytes).map_err(|_| {
                format!("svm must be 'always', 'never' or a minimum byte count, not '{s}'")
            }),
        }
    }

    pub(super) fn grants(self, alloc_bytes: u64) -> bool {
        match self {
            SvmPolicy::Always => true,
            SvmPolicy::Never => false,
            SvmPolicy::MinBytes(n) => alloc_bytes >= n,
        }
    }
}
