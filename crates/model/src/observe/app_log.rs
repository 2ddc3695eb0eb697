//! An application's own log (a training job's, a notebook's, a container's): the CUDA errors
//! in it, and whether they name the license. Users meet an unlicensed vGPU through these
//! words, not gridd's, and read them as memory or code bugs.
//!
//! - CUDA error 102, `cudaErrorDeviceNotLicensed` (`CUDA_ERROR_DEVICE_NOT_LICENSED`), whose
//!   text is `device doesn't have valid Grid license` (PyTorch: `RuntimeError: CUDA error:
//!   device doesn't have valid Grid license`): the license, beyond doubt.
//! - `operation not supported` and `busy or unavailable` from CUDA (TensorFlow:
//!   `cudaSetDevice() on GPU:0 failed. Status: operation not supported`): how a vGPU
//!   throttled for want of a license fails, but also what a CUDA runtime newer than its
//!   driver allows, a driver not installed right, or a device held by another process,
//!   gives. Beside a license line they
//!   are part of it; alone, only a hint to look at the license, never a verdict.
//! - Any other CUDA error (out of memory, invalid device ordinal, ...): never the license.

/// What a CUDA error line says of the license.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weight {
    /// CUDA error 102: the device holds no valid license.
    License,
    /// `operation not supported`, `busy or unavailable`: may be the license.
    Hint,
    /// Any other CUDA error: not the license.
    Other,
}

/// One CUDA error line of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    /// 1-based.
    pub line: usize,
    /// The line, trimmed (and cut to [`MAX_TEXT`] bytes).
    pub text: String,
    pub weight: Weight,
}

/// The CUDA errors of an application's log: the first of each weight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppLog {
    pub license: Option<CudaError>,
    pub hint: Option<CudaError>,
    pub other: Option<CudaError>,
}

impl AppLog {
    /// Whether the log holds any CUDA error.
    pub fn any(&self) -> bool {
        self.license.is_some() || self.hint.is_some() || self.other.is_some()
    }
}

/// A line's text kept in a report at most this long.
pub const MAX_TEXT: usize = 400;

/// The wordings of CUDA error 102 (runtime and driver API names, its text, PyTorch's
/// older `cuda runtime error (102)`), lowercased.
const LICENSE_WORDS: [&str; 6] = [
    "device doesn't have valid grid license",
    "device doesn\u{2019}t have valid grid license",
    "cudaerrordevicenotlicensed",
    "cuda_error_device_not_licensed",
    "cuda runtime error (102)",
    "cuda error 102",
];

/// What a throttled vGPU's CUDA calls fail with, among other causes.
const HINT_WORDS: [&str; 2] = ["operation not supported", "busy or unavailable"];

/// What marks a line as a CUDA error at all.
const CUDA_WORDS: [&str; 7] = [
    "cuda error",
    "cuda runtime error",
    "cuda out of memory",
    "cudaerror",
    "cuda_error",
    "cudasetdevice",
    "cuda-capable device",
];

/// Classifies one line: `None` when it is no CUDA error.
pub fn classify(line: &str) -> Option<Weight> {
    Words::of(line).weight()
}

/// Which of the words a line (or a window of it) holds.
#[derive(Default, Clone, Copy)]
struct Words {
    license: bool,
    cuda: bool,
    hint: bool,
}

impl Words {
    fn of(text: &str) -> Words {
        Words::default().and(text)
    }

    /// These, and the words `text` holds that these lack (a word found is not looked for
    /// again).
    fn and(self, text: &str) -> Words {
        let lower = text.to_lowercase();
        let any = |seen: bool, words: &[&str]| seen || words.iter().any(|w| lower.contains(w));
        Words {
            license: any(self.license, &LICENSE_WORDS),
            cuda: any(self.cuda, &CUDA_WORDS),
            hint: any(self.hint, &HINT_WORDS),
        }
    }

    fn weight(self) -> Option<Weight> {
        match self {
            Words { license: true, .. } => Some(Weight::License),
            Words { cuda: false, .. } => None,
            Words { hint: true, .. } => Some(Weight::Hint),
            _ => Some(Weight::Other),
        }
    }
}

/// A line longer than this is read a window at a time, each overlapping the one before by
/// more than the longest word looked for: a line of hundreds of megabytes (a log without
/// newlines) costs a window or two beside the input, never copies of itself.
const WINDOW: usize = 64 << 10;
const OVERLAP: usize = 128;

/// [`classify`] of a line's bytes, window by window where it is long, and where the words
/// that decided it begin (about: the window's offset of the first of them), for the text
/// the report keeps.
fn classify_bytes(raw: &[u8]) -> Option<(Weight, usize)> {
    let mut words = Words::default();
    let (mut license_at, mut cuda_at) = (None, None);
    let mut start = 0;
    loop {
        let end = (start + WINDOW).min(raw.len());
        let window = String::from_utf8_lossy(&raw[start..end]);
        let before = words;
        words = words.and(&window);
        let lower = || window.to_lowercase();
        if words.license && !before.license {
            license_at = Some(start + first_of(&lower(), &LICENSE_WORDS));
        }
        if words.cuda && !before.cuda {
            cuda_at = Some(start + first_of(&lower(), &CUDA_WORDS));
        }
        if end == raw.len() || words.license {
            let weight = words.weight()?;
            let at = if weight == Weight::License {
                license_at
            } else {
                cuda_at
            };
            return Some((weight, at.unwrap_or(0)));
        }
        start = end - OVERLAP;
    }
}

/// Where the first of `words` begins in `lower` (0 where none does).
fn first_of(lower: &str, words: &[&str]) -> usize {
    words
        .iter()
        .filter_map(|w| lower.find(w))
        .min()
        .unwrap_or(0)
}

/// Reads an application's log, any text (invalid UTF-8 is replaced).
///
/// ```
/// use vgpu_license_model::observe::app_log;
///
/// let log = "Traceback (most recent call last):\n\
///     RuntimeError: CUDA error: device doesn't have valid Grid license\n";
/// let found = app_log::scan(log.as_bytes());
/// assert_eq!(found.license.unwrap().line, 2);
/// let oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB.\n";
/// assert!(app_log::scan(oom.as_bytes()).license.is_none());
/// ```
pub fn scan(input: &[u8]) -> AppLog {
    let mut found = AppLog::default();
    for (i, raw) in input.split(|&b| b == b'\n').enumerate() {
        let Some((weight, at)) = classify_bytes(raw) else {
            continue;
        };
        // What the report keeps of the line: its start, or in a line longer than that, from
        // a little before the words that decided it.
        let from = if raw.len() > 4 * MAX_TEXT {
            at.saturating_sub(MAX_TEXT / 4).min(raw.len())
        } else {
            0
        };
        let line = String::from_utf8_lossy(&raw[from..raw.len().min(from + 4 * MAX_TEXT + 4)]);
        let slot = match weight {
            Weight::License => &mut found.license,
            Weight::Hint => &mut found.hint,
            Weight::Other => &mut found.other,
        };
        if slot.is_none() {
            *slot = Some(CudaError {
                line: i + 1,
                text: cut(line.trim()),
                weight,
            });
        }
        if found.license.is_some() && found.hint.is_some() && found.other.is_some() {
            break;
        }
    }
    found
}

fn cut(s: &str) -> String {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_error_102_is_the_license_and_the_not_supported_family_a_hint() {
        use Weight::*;
        for (line, want) in [
            (
                "RuntimeError: CUDA error: device doesn't have valid Grid license",
                Some(License),
            ),
            ("cudaErrorDeviceNotLicensed", Some(License)),
            ("CUresult 102 CUDA_ERROR_DEVICE_NOT_LICENSED", Some(License)),
            (
                "RuntimeError: cuda runtime error (102) : device doesn't have valid Grid license at x.cpp:47",
                Some(License),
            ),
            (
                "tensorflow.python.framework.errors_impl.InternalError: cudaSetDevice() on GPU:0 failed. Status: operation not supported",
                Some(Hint),
            ),
            (
                "InternalError: CUDA runtime implicit initialization on GPU:0 failed. Status: all CUDA-capable devices are busy or unavailable",
                Some(Hint),
            ),
            (
                "RuntimeError: CUDA error: invalid device ordinal",
                Some(Other),
            ),
            (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB.",
                Some(Other),
            ),
            (
                "RuntimeError: cuda runtime error (101) : invalid device ordinal",
                Some(Other),
            ),
            // Not CUDA's: a file system's or a network's words.
            ("cp: operation not supported", None),
            ("epoch 3: loss 0.12, out of memory errors: 0", None),
        ] {
            assert_eq!(classify(line), want, "{line}");
        }
    }

    #[test]
    fn the_first_line_of_each_weight_is_kept_with_its_number() {
        let log = "start\nRuntimeError: CUDA error: invalid device ordinal\n\
            cudaSetDevice() on GPU:0 failed. Status: operation not supported\n\
            device doesn't have valid Grid license\n\
            device doesn't have valid Grid license\n";
        let found = scan(log.as_bytes());
        assert_eq!(found.other.as_ref().map(|e| e.line), Some(2));
        assert_eq!(found.hint.as_ref().map(|e| e.line), Some(3));
        assert_eq!(found.license.as_ref().map(|e| e.line), Some(4));
        let long = format!("CUDA error: {}\n", "x".repeat(10_000));
        assert_eq!(scan(long.as_bytes()).other.unwrap().text.len(), MAX_TEXT);
        assert!(!scan(b"all good\n").any());
    }

    /// A line far longer than a window is read window by window: error 102 deep in it, and a
    /// CUDA error and its "not supported" in two windows apart, are found.
    #[test]
    fn a_huge_line_is_read_in_windows() {
        let pad = "x".repeat(3 * WINDOW + 17);
        let deep = format!("{pad} device doesn't have valid Grid license {pad}");
        let found = scan(deep.as_bytes());
        assert_eq!(found.license.as_ref().map(|e| e.line), Some(1));
        assert!(found.license.unwrap().text.len() <= MAX_TEXT);
        // What is kept is the words that decided it, not the line's start.
        let found = scan(deep.as_bytes());
        assert!(
            found.license.unwrap().text.contains("valid Grid license"),
            "the text kept is around the words"
        );
        let apart = format!("CUDA error: {pad} operation not supported");
        assert_eq!(
            classify_bytes(apart.as_bytes()).map(|w| w.0),
            Some(Weight::Hint)
        );
        // A word cut by a window's end is still seen.
        let at_edge = format!("{}cudaErrorDeviceNotLicensed", "x".repeat(WINDOW - 10));
        assert_eq!(
            classify_bytes(at_edge.as_bytes()).map(|w| w.0),
            Some(Weight::License)
        );
        assert_eq!(classify_bytes("x".repeat(2 * WINDOW).as_bytes()), None);
    }
}
