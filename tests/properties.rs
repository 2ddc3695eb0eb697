//! No input makes a parser panic, and parsing time grows linearly with the input.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use vgpu_license_agent::cli::Cli;
use vgpu_license_agent::config::Settings;
use vgpu_license_agent::gridd_conf::GriddConf;
use vgpu_license_agent::observe::{journal, smi};
use vgpu_license_agent::state::{LogFold, Observations, evaluate};
use vgpu_license_agent::token::Token;

/// Every numeric key of the config.
const NUMERIC_KEYS: &[(&str, &str)] = &[
    ("commands", "timeout_seconds"),
    ("gridd", "feature_type"),
    ("service", "expiry_warning_hours"),
    ("service", "poll_unlicensed_seconds"),
    ("service", "poll_licensed_seconds"),
    ("service", "restart_grace_seconds"),
    ("service", "restart_backoff_seconds"),
    ("service", "restart_backoff_max_seconds"),
    ("service", "restart_budget_per_hour"),
    ("service", "probe_timeout_seconds"),
    ("service", "clock_skew_max_seconds"),
];

/// Every numeric flag, with the command it belongs to.
const NUMERIC_FLAGS: &[&[&str]] = &[
    &["status", "--wait"],
    &["analyze", "--smi", "x", "--max-events"],
    &["install", "--token-url", "https://x/t", "--timeout"],
    &["install", "--token-url", "https://x/t", "--retries"],
    &["install", "--token-file", "x", "--feature-type"],
];

/// Whatever a config holds, a loaded one gives durations that no later computation
/// (an instant plus a duration, a chrono duration) can overflow.
fn durations_are_safe(s: &Settings) {
    let sv = &s.service;
    for d in [
        s.commands.timeout,
        sv.expiry_warning,
        sv.poll_unlicensed,
        sv.poll_licensed,
        sv.restart_grace,
        sv.restart_backoff,
        sv.restart_backoff_max,
        sv.probe_timeout,
        sv.clock_skew_max,
    ] {
        assert!(d <= Duration::from_secs(366 * 86_400), "{d:?}");
        assert!(Instant::now().checked_add(d * 4).is_some());
        assert!(chrono::Duration::from_std(d).is_ok());
    }
    assert!(sv.restart_budget_per_hour <= 60);
}

/// Pieces of real lines, so that random inputs reach deep into the parsers.
const PIECES: &[&str] = &[
    "nvidia-gridd",
    "nvidia-gridd[12]: ",
    "Dec 20 17:53:32 host ",
    "2024-09-16T01:16:29+0800 ",
    "Mon 2024-09-16 01:16:29 CST ",
    "Active: active (running) since Mon 2024-12-30 01:16:29 UTC; 1s ago\n",
    "License acquired successfully. (Info: ",
    "Failed to acquire license from ",
    "(Info: NVIDIA Virtual PC - Error: ",
    "Expiry: 2024-12-14 17:16:31 GMT)",
    "Expiry: 9999-99-99 99:99:99 GMT",
    "{\"_COMM\":\"nvidia-gridd\",\"MESSAGE\":",
    "\"__REALTIME_TIMESTAMP\":\"99999999999999999999\"",
    "[1,2,255,300]",
    "}",
    "\n",
    "GPU 00000000:02:01.0\n",
    "vGPU Software Licensed Product\n",
    "License Status : Licensed (Expiry: ",
    "Product Name : ",
    "<nvidia_smi_log><gpu id=\"x\">",
    "<license_status>",
    "</gpu>",
    "<0>:",
    "Tue Dec 20 17:25:11 2022:",
    "\u{fffd}",
    ":",
    " ",
    "[",
    "]",
    "#",
    "<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">",
    "<!DOCTYPE x [<!ENTITY a \"aaaa\">]>",
    "&a;",
];

fn pieces() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(PIECES).prop_map(|p| p.as_bytes().to_vec()),
            prop::collection::vec(any::<u8>(), 0..16),
        ],
        0..64,
    )
    .prop_map(|v| v.concat())
}

fn everything(input: &[u8]) {
    let snap = smi::parse(input).ok();
    let mut fold = LogFold::new(50);
    let stats = journal::scan(input, |e| fold.push(e)).unwrap();
    let _ = Token::decode(input);
    let _ = GriddConf::parse(input);
    let text = String::from_utf8_lossy(input);
    let escaped = vgpu_license_agent::text::escape(&text);
    assert!(!escaped.chars().any(char::is_control), "{escaped:?}");
    let _ = journal::classify(&String::from_utf8_lossy(input));
    let report = evaluate(Observations {
        smi: snap,
        log: Some((fold, stats)),
        ..Observations::default()
    });
    serde_json::to_string(&report).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..4096)) {
        everything(&input);
    }

    #[test]
    fn line_fragments_never_panic(input in pieces()) {
        everything(&input);
    }

    #[test]
    fn any_number_in_any_config_key_is_taken_or_refused(
        key in prop::sample::select(NUMERIC_KEYS),
        value in prop_oneof![
            any::<u64>().prop_map(|v| v.to_string()),
            any::<i64>().prop_map(|v| v.to_string()),
            (0u64..100_000).prop_map(|v| v.to_string()),
            Just("1e300".to_string()),
            Just("\"12\"".to_string()),
            Just("99999999999999999999999".to_string()),
        ],
    ) {
        let mut s = Settings::default();
        let text = format!("[{}]\n{} = {value}\n", key.0, key.1);
        match s.apply_toml(&text) {
            Ok(()) => durations_are_safe(&s),
            Err(e) => {
                prop_assert!(e.contains(key.1), "{e}");
                prop_assert!(!e.contains('\n'), "{e}");
                durations_are_safe(&s);
            }
        }
    }

    #[test]
    fn any_number_in_any_flag_is_parsed_or_refused(
        flag in prop::sample::select(NUMERIC_FLAGS),
        value in prop_oneof![
            any::<u64>().prop_map(|v| v.to_string()),
            any::<i64>().prop_map(|v| v.to_string()),
            Just("18446744073709551616".to_string()),
            Just("nan".to_string()),
        ],
    ) {
        use clap::Parser;
        let mut args = vec!["vgpu-license-agent"];
        args.extend_from_slice(flag);
        args.push(&value);
        if let Ok(cli) = Cli::try_parse_from(&args) {
            match cli.command {
                vgpu_license_agent::cli::Command::Status(a) => {
                    prop_assert!(a.wait.is_none_or(|w| w <= 86_400));
                }
                vgpu_license_agent::cli::Command::Analyze(a) => {
                    prop_assert!((1..=100_000).contains(&a.max_events));
                }
                vgpu_license_agent::cli::Command::Install(a) => {
                    prop_assert!(a.timeout.is_none_or(|t| (1..=3600).contains(&t)));
                    prop_assert!(a.retries <= 20);
                }
                _ => {}
            }
        }
    }
}

#[test]
fn megabyte_lines_and_invalid_utf8() {
    let mut input = b"Dec 20 17:53:32 host nvidia-gridd[1]: ".to_vec();
    input.extend(std::iter::repeat_n(b'(', 1 << 20));
    input.extend_from_slice(b"\n{\"_COMM\":\"nvidia-gridd\",\"MESSAGE\":\"");
    input.extend(std::iter::repeat_n(0xffu8, 1 << 20));
    input.extend_from_slice(b"\"}\n");
    everything(&input);
    // A line beyond the longest one kept is skipped, and the lines after it still count.
    let mut input = vec![b'{'];
    input.extend(std::iter::repeat_n(b'x', journal::MAX_LINE + 10));
    input.extend_from_slice(
        b"nvidia-gridd\n{\"_COMM\":\"nvidia-gridd\",\"MESSAGE\":\"NLS initialized\"}\n",
    );
    let mut n = 0;
    let stats = journal::scan(&input[..], |_| n += 1).unwrap();
    assert_eq!(n, 1);
    assert_eq!(stats.skipped_long_lines, 1);
}

const GROWTH_BOUND: f64 = 32.0;

fn best_of(runs: usize, f: impl Fn()) -> Duration {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap()
}

/// Time for `input` repeated 8 times against `input` once, best of several runs: a linear
/// parser gives about 8, a quadratic one about 64. The bound used, 32, sits between them
/// with room for a busy machine (caches, a parallel build) to skew one of the two timings.
fn growth(unit: &[u8], parse: impl Fn(&[u8])) -> f64 {
    let small = unit.repeat(64);
    let large = unit.repeat(512);
    let t1 = best_of(7, || parse(&small));
    let t8 = best_of(7, || parse(&large));
    t8.as_secs_f64() / t1.as_secs_f64().max(1e-9)
}

#[test]
fn parsing_time_grows_linearly() {
    let shapes: &[&[u8]] = &[
        // Many gridd lines, text and JSON.
        b"Dec 20 17:53:34 h nvidia-gridd[10354]: License acquired successfully. (Info: 192.168.178.110, NVIDIA RTX Virtual Workstation; Expiry: 2022-12-21 16:53:33 GMT)\n",
        b"{\"__REALTIME_TIMESTAMP\":\"1700000000000000\",\"_COMM\":\"nvidia-gridd\",\"MESSAGE\":\"Failed to acquire license from 10.0.0.5\"}\n",
        // One line that never ends, full of the characters the parsers look for.
        b"nvidia-gridd[1]: (Info: a, b; Expiry: :::: ((((  ",
        b"{\"_COMM\":\"x\",\"MESSAGE\":\"nvidia-gridd nvidia-gridd nvidia-gridd\"",
    ];
    for shape in shapes {
        let unit = shape.repeat(200);
        let ratio = growth(&unit, |input| {
            let mut fold = LogFold::new(100);
            journal::scan(input, |e| fold.push(e)).unwrap();
        });
        assert!(
            ratio < GROWTH_BOUND,
            "journal: 8x the input took {ratio:.1}x the time for {:?}",
            String::from_utf8_lossy(&shape[..30])
        );
    }
    let smi_shapes: &[&[u8]] = &[
        b"GPU 00000000:02:01.0\n    Product Name : GRID A100-4C\n    vGPU Software Licensed Product\n        License Status : Licensed (Expiry: 2022-5-27 0:8:28 GMT)\n",
        b"License Status : Licensed (Expiry: ((((((((((((((((((((((((",
    ];
    for shape in smi_shapes {
        let unit = shape.repeat(100);
        let ratio = growth(&unit, |input| {
            smi::parse(input).unwrap();
        });
        assert!(
            ratio < GROWTH_BOUND,
            "smi: 8x the input took {ratio:.1}x the time"
        );
    }
}

/// A reader that hands out at most `step` bytes per read: how a pipe delivers a stream.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn events_of(r: impl std::io::Read) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    journal::scan(r, |e| {
        out.push((e.message.clone(), e.stamp.and_then(|s| s.at())))
    })
    .unwrap();
    out
}

/// Real gridd lines, in the samples' forms: syslog, ISO and journal JSON.
const LINES: &[&str] = &[
    "Dec 20 17:53:32 host nvidia-gridd[10354]: License acquired successfully. (Info: 192.168.178.110, NVIDIA RTX Virtual Workstation; Expiry: 2022-12-21 16:53:33 GMT)",
    "2024-09-16T01:16:29+0800 host nvidia-gridd[77]: Failed to acquire license from 10.0.0.5 (Info: NVIDIA Virtual Compute Server - Error: No pool features found for : NVIDIA Virtual Compute Server)",
    "{\"_COMM\":\"nvidia-gridd\",\"MESSAGE\":\"Acquiring license. (Info: dls.example; NVIDIA RTX Virtual Workstation)\",\"__REALTIME_TIMESTAMP\":\"1734716012000000\"}",
    "Dec 20 17:53:40 host nvidia-gridd[10354]: Failed to acquire license from dls.example",
];

fn stream() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(prop::sample::select(LINES), 1..40),
        any::<bool>(),
        0usize..2,
    )
        .prop_map(|(lines, crlf, pad_mb)| {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut s = String::new();
            for (i, l) in lines.iter().enumerate() {
                s.push_str(l);
                s.push_str(eol);
                // Lines longer than the reader's 1 MiB chunk, that are not gridd's, in
                // between (after the first line, which tells JSON from text).
                if i == 0 {
                    for _ in 0..pad_mb {
                        s.push_str(&"x".repeat((1 << 20) + 17));
                        s.push_str(eol);
                    }
                }
            }
            s.into_bytes()
        })
}

/// gridd's unpadded time (`2022-12-21 6:3:3 GMT`), as in its `Expiry:` lines.
fn gridd_time(t: chrono::DateTime<chrono::Utc>) -> String {
    use chrono::{Datelike, Timelike};
    format!(
        "{}-{}-{} {}:{}:{} GMT",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Whole, trickled 1 to 7 bytes at a time, with CRLF, with megabyte lines: the same events.
    #[test]
    fn a_stream_gives_the_same_events_however_it_arrives(data in stream(), step in 1usize..8) {
        let whole = events_of(&data[..]);
        let lf: Vec<u8> = String::from_utf8(data.clone()).unwrap().replace("\r\n", "\n").into_bytes();
        prop_assert_eq!(&whole, &events_of(&lf[..]));
        prop_assert_eq!(&whole, &events_of(Trickle { data: &data, step }));
        prop_assert!(!whole.is_empty());
    }

    /// An expiry written as gridd writes it reads back as the same time.
    #[test]
    fn gridd_times_read_back_exactly(secs in 0i64..253_402_300_799) {
        let t = chrono::DateTime::from_timestamp(secs, 0).unwrap();
        let line = format!(
            "License acquired successfully. (Info: d, NVIDIA RTX Virtual Workstation; Expiry: {})",
            gridd_time(t)
        );
        let c = journal::classify(&line).expect("an acquire line");
        prop_assert_eq!(c.expiry, Some(t));
    }

    /// Every report the state machine makes is valid against the report's schema.
    #[test]
    fn every_report_validates_against_the_schema(input in pieces()) {
        let schema: serde_json::Value = serde_json::from_str(include_str!("fixtures/report.schema.json")).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let snap = smi::parse(&input).ok();
        let mut fold = LogFold::new(50);
        let stats = journal::scan(&input[..], |e| fold.push(e)).unwrap();
        let report = evaluate(Observations {
            smi: snap,
            log: Some((fold, stats)),
            ..Observations::default()
        });
        let v = serde_json::to_value(&report).unwrap();
        let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
        prop_assert!(errors.is_empty(), "{errors:?}\n{v:#}");
    }
}

/// nvidia-smi -q text without its indentation (a paste that lost it) reads the same.
#[test]
fn smi_text_reads_the_same_without_indentation() {
    for name in [
        "smi-jp-dls-guide-1.txt",
        "smi-jp-dls-guide-2.txt",
        "smi-fastapi-dls-1.txt",
        "smi-cudaerror4vgpu-1.txt",
        "smi-gpu-operator-220.txt",
    ] {
        let path = format!(
            "{}/tests/fixtures/samples/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let flat: String = text
            .lines()
            .map(|l| l.trim_start().to_string() + "\n")
            .collect();
        let a = format!("{:?}", smi::parse_text(&text));
        let b = format!("{:?}", smi::parse_text(&flat));
        assert_eq!(a, b, "{name}");
        assert!(a.contains("gpus"), "{name}");
    }
}
