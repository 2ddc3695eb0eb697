//! Every line the simulated nvidia-gridd can log, as a template (`{}` stands for a value), with
//! where it comes from. The simulated gridd logs nothing else (it logs through [`Line`] only),
//! and the self-check (`tests/sim_selfcheck.rs`) holds each template to its source: a line
//! from a sample in `tests/fixtures/samples/` must match a line of each sample named, and a
//! line marked [`Source::Unsampled`] must match none (so that the mark goes when a sample
//! comes). Unsampled lines are kept only where the samples are silent and the simulator needs
//! to log something; each says why.

#![allow(dead_code)]

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Shown by these samples (file names under `tests/fixtures/samples/`).
    Sample(&'static [&'static str]),
    /// No sample shows it: why the simulator logs it anyway, and from what.
    Unsampled(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    pub template: &'static str,
    pub source: Source,
}

impl Line {
    /// The template with `args` in place of its `{}`s, in order.
    pub fn format(&self, args: &[&str]) -> String {
        let mut out = String::new();
        let mut parts = self.template.split("{}");
        out += parts.next().unwrap_or_default();
        for (i, p) in parts.enumerate() {
            out += args.get(i).copied().unwrap_or("?");
            out += p;
        }
        debug_assert_eq!(self.template.matches("{}").count(), args.len());
        out
    }

    /// Whether `message` is this template with some non-empty text for each `{}`.
    pub fn matches(&self, message: &str) -> bool {
        template_matches(self.template, message)
    }
}

/// Whether `message` is `template` with some non-empty text in place of each `{}`.
pub fn template_matches(template: &str, message: &str) -> bool {
    let parts: Vec<&str> = template.split("{}").collect();
    if parts.len() == 1 {
        return template == message;
    }
    let Some(mut rest) = message.strip_prefix(parts[0]) else {
        return false;
    };
    let last = parts[parts.len() - 1];
    for p in &parts[1..parts.len() - 1] {
        // A value, then the literal: the first place the literal follows a non-empty value.
        let Some(i) = rest.get(1..).and_then(|r| r.find(p)) else {
            return false;
        };
        rest = &rest[i + 1 + p.len()..];
    }
    rest.len() > last.len() && rest.ends_with(last)
}

const FNOS: &str = "gridd-log-fnos-1.txt";
const JP: &str = "gridd-log-jp-dls-guide-1.txt";
const CUDAERROR: &str = "gridd-log-cudaerror4vgpu-1.txt";
const FASTAPI_1: &str = "gridd-log-fastapi-dls-1.txt";
const FASTAPI_2: &str = "gridd-log-fastapi-dls-2.txt";
const NREC: &str = "gridd-log-nrec-1.txt";

pub const STARTED: Line = Line {
    template: "Started ({})",
    source: Source::Sample(&[JP, "gridd-log-legacy-flexnet-1.txt"]),
};
pub const NO_GRIDD_CONF: Line = Line {
    template: "Failed to open file {} (No such file or directory)",
    source: Source::Sample(&[FNOS]),
};
pub const SERVER_ADDRESS_NOT_SET: Line = Line {
    template: "Configuration parameter ( ServerAddress  ) not set",
    source: Source::Sample(&[FASTAPI_2]),
};
/// Drivers 510 to 535 (jp-dls-guide: 510.47.03, fastapi-dls-1: 525.60.13, cudaerror4vgpu:
/// 535.183.06). The only 550 sample (fnos-1, 550.90.07) goes straight from gridd.conf's lines
/// to `Ignore service provider...`: a 550 gridd does not log it.
pub const PACKAGE_0: Line = Line {
    template: "vGPU Software package (0)",
    source: Source::Sample(&[JP, FASTAPI_1, FASTAPI_2, CUDAERROR]),
};
pub const IGNORE_SERVICE_PROVIDER: Line = Line {
    template: "Ignore service provider and node-locked licensing",
    source: Source::Sample(&[JP, FNOS, FASTAPI_1, CUDAERROR]),
};
pub const NLS_INITIALIZED: Line = Line {
    template: "NLS initialized",
    source: Source::Sample(&[JP, FNOS, FASTAPI_1, CUDAERROR, NREC]),
};
pub const LICENSING_UNSUPPORTED: Line = Line {
    template: "Licensing not supported for GPUs in the system",
    source: Source::Unsampled(
        "a passthrough GPU under the GRID guest driver: domain.md lists the line verbatim \
         among the failures seen in the wild; no sample shows it",
    ),
};
pub const TOKEN_MISSING: Line = Line {
    template: "Unable to fetch the client configuration token file",
    source: Source::Sample(&[NREC]),
};
pub const DECODE_SIGNATURE: Line = Line {
    template: "Failed to decode signature from token received",
    source: Source::Sample(&[CUDAERROR]),
};
/// The error text after `(Error: ` is cut off in the only sample (cudaerror4vgpu-1, by the
/// pager); see [`TOKEN_CONFIG_ERROR_TEXT`].
pub const READ_TOKEN_CONFIG: Line = Line {
    template: "Failed to read configurations from client configuration token (Error: {})",
    source: Source::Unsampled(
        "the only sample (gridd-log-cudaerror4vgpu-1.txt) shows this line cut off by the pager \
         after `(Error: `; its error text is not known",
    ),
};
/// What follows `(Error: ` in [`READ_TOKEN_CONFIG`]: no sample shows it. This is the
/// FlexNet Embedded description of a bad signature (flexnet-embedded-error-strings.txt), a
/// guess; the agent must not rely on it.
pub const TOKEN_CONFIG_ERROR_TEXT: &str = "Signature didn't pass validation.";
pub const SETUP_LICENSE_MANAGER: Line = Line {
    template: "Failed to setup cloud License Manager: 3",
    source: Source::Sample(&[CUDAERROR]),
};
pub const ACQUIRING: Line = Line {
    template: "Acquiring license. (Info: {}; {})",
    source: Source::Sample(&[JP, FNOS, FASTAPI_1, FASTAPI_2, NREC]),
};
pub const ACQUIRED: Line = Line {
    template: "License acquired successfully. (Info: {}, {}; Expiry: {})",
    source: Source::Sample(&[FNOS, FASTAPI_1, FASTAPI_2, NREC]),
};
/// Seen in a Windows guest's log (the same licensing library); no Linux sample renews.
pub const RENEWED: Line = Line {
    template: "License renewed successfully. (Info: {}, {}; Expiry: {})",
    source: Source::Sample(&["gridd-log-fastapi-dls-5-windows.txt"]),
};
/// Seen in Windows guests' logs (the same licensing library).
pub const RETURNED: Line = Line {
    template: "License returned successfully. (Info: {})",
    source: Source::Sample(&[
        "gridd-log-fastapi-dls-4-windows.txt",
        "gridd-log-fastapi-dls-5-windows.txt",
    ]),
};
/// Seen in a Windows guest's log (the same licensing library), when the DLS could not be
/// reached at shutdown.
pub const RETURN_FAILED: Line = Line {
    template: "Failed to return license to {} (Error: Generic network communication failure)",
    source: Source::Sample(&["gridd-log-fastapi-dls-4-windows.txt"]),
};
/// Seen in a Windows guest's log (the same licensing library).
pub const NOT_FOUND_NOTICE: Line = Line {
    template: "Valid GRID license not found. GPU features and performance will be restricted. To enable full functionality please configure licensing details.",
    source: Source::Sample(&[
        "gridd-log-fastapi-dls-3-windows.txt",
        "gridd-log-fastapi-dls-mirror-issue3-windows.txt",
    ]),
};
pub const SHUTDOWN: Line = Line {
    template: "Shutdown ({})",
    source: Source::Sample(&[CUDAERROR]),
};
/// A failure with its cause: server, edition, error text.
pub const ACQUIRE_FAILED: Line = Line {
    template: "Failed to acquire license from {} (Info: {} - Error: {})",
    source: Source::Unsampled(
        "domain.md gives this form verbatim with its error texts (clock windback, no pool \
         features) as seen in the wild; no sample here shows a failed acquisition",
    ),
};
/// The bare form, without a cause.
pub const ACQUIRE_FAILED_BARE: Line = Line {
    template: "Failed to acquire license from {}",
    source: Source::Unsampled(
        "domain.md: seen in the wild, often right after a more specific line (trusted store, \
         register client); what gridd logs on a network failure is not known, so the \
         simulator can log this form or the full one (SimConfig::network_failure)",
    ),
};

const LEGACY: &str = "gridd-log-legacy-flexnet-1.txt";

/// The legacy licensing path (a FlexNet license server, drivers up to the 470 branch): after
/// `Started`, before the acquisition.
pub const LEGACY_SERVICE_PROVIDER_DETECTION: Line = Line {
    template: "Service provider detection complete.",
    source: Source::Sample(&[LEGACY]),
};
/// The legacy acquisition: the server's URL (`http://<ServerAddress>:<ServerPort>/request`),
/// no expiry.
pub const LEGACY_ACQUIRED: Line = Line {
    template: "License acquired successfully. Server URL : {}",
    source: Source::Sample(&[LEGACY]),
};
/// The legacy state message right after the acquisition, as the sample words it for a vGPU
/// guest.
pub const LEGACY_LICENSED_FOR: Line = Line {
    template: "Your system is licensed for GRID vGPU.",
    source: Source::Sample(&[LEGACY]),
};
/// The legacy failure, verbatim: the one sample (AWS's G3 guide) names the Virtual
/// Workstation feature and gives no cause. What a legacy vGPU guest's gridd names there, and
/// whether it says why, is not known: the simulator keeps the sample's words.
pub const LEGACY_ACQUIRE_FAILED: Line = Line {
    template: "Failed to acquire NVIDIA GRID Virtual Workstation license.",
    source: Source::Sample(&["gridd-log-aws-g3-docs-legacy.txt"]),
};

/// The error texts of [`ACQUIRE_FAILED`] the simulator uses, with where each comes from.
/// Clock skew: domain.md, and FlexNet Embedded's table (flexnet-embedded-error-strings.txt).
pub const ERROR_WINDBACK: &str = "Clock windback has been detected";
/// A network failure: the text a real client (Windows guest, same library) logged when it
/// could not reach the DLS to return its lease (gridd-log-fastapi-dls-4-windows.txt).
pub const ERROR_NETWORK: &str = "Generic network communication failure";
/// A DLS (or a proxy in front of it) answering with an HTTP error status: FlexNet Embedded's
/// description of that case (flexnet-embedded-error-strings.txt); gridd's own wording is not
/// known.
pub const ERROR_HTTP: &str = "Server returned an http error code";

/// Every line the simulated gridd can log.
pub const ALL: &[Line] = &[
    STARTED,
    NO_GRIDD_CONF,
    SERVER_ADDRESS_NOT_SET,
    PACKAGE_0,
    IGNORE_SERVICE_PROVIDER,
    NLS_INITIALIZED,
    LICENSING_UNSUPPORTED,
    TOKEN_MISSING,
    DECODE_SIGNATURE,
    READ_TOKEN_CONFIG,
    SETUP_LICENSE_MANAGER,
    ACQUIRING,
    ACQUIRED,
    RENEWED,
    RETURNED,
    RETURN_FAILED,
    NOT_FOUND_NOTICE,
    SHUTDOWN,
    ACQUIRE_FAILED,
    ACQUIRE_FAILED_BARE,
    LEGACY_SERVICE_PROVIDER_DETECTION,
    LEGACY_ACQUIRED,
    LEGACY_LICENSED_FOR,
    LEGACY_ACQUIRE_FAILED,
];

/// The template `message` is, if any ([`ALL`] in order: the full acquire failure before the
/// bare one).
pub fn template_of(message: &str) -> Option<&'static Line> {
    ALL.iter().find(|l| l.matches(message))
}
