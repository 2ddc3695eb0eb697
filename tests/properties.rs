//! No input makes a parser panic, a parser's work (its allocations) grows linearly with the
//! input, and what a parser keeps is bounded by what it read. Every config key and every command-line flag
//! takes any value: taken within its checks, or refused on one line.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use vgpu_license_agent::cli::Cli;
use vgpu_license_model::config::Settings;
use vgpu_license_model::gridd_conf::GriddConf;
use vgpu_license_model::observe::{journal, smi};
use vgpu_license_model::state::{LogFold, Observations, evaluate};
use vgpu_license_model::time::LogTime;
use vgpu_license_model::token::Token;

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
    ("service", "first_token_look_seconds"),
    ("kubernetes", "heartbeat_seconds"),
];

/// Every numeric flag, with the command it belongs to.
const NUMERIC_FLAGS: &[&[&str]] = &[
    &["status", "--wait"],
    &["analyze", "--smi", "x", "--max-events"],
    &["install", "--token-url", "https://x/t", "--timeout"],
    &["install", "--token-url", "https://x/t", "--retries"],
    &["install", "--token-file", "x", "--feature-type"],
    // Signals only a process that is the agent: a fuzzed pid never reaches another one.
    &["config", "check", "--reload"],
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
        sv.first_token_look,
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
    let text = String::from_utf8_lossy(input);
    let lines = input.iter().filter(|b| **b == b'\n').count() + 1;
    let snap = smi::parse(input).ok();
    if let Some(s) = &snap {
        // A GPU takes a line of its own in text, an element of its own in XML.
        let room = if text.trim_start().starts_with('<') {
            input.iter().filter(|b| **b == b'<').count()
        } else {
            lines
        };
        assert!(s.gpus.len() <= room, "{} GPUs", s.gpus.len());
    }
    let mut fold = LogFold::new(50);
    let (mut events, mut message_bytes) = (0, 0);
    let stats = journal::scan(input, |e| {
        events += 1;
        message_bytes += e.message.len();
        fold.push(e)
    })
    .unwrap();
    // One event at most per line, its text no longer than the line once invalid UTF-8 is
    // replaced (a byte becomes at most the 3 of U+FFFD).
    assert!(events <= lines, "{events} events from {lines} lines");
    assert!(message_bytes <= 3 * input.len());
    if let Ok(t) = Token::decode(input) {
        let now = chrono::Utc::now();
        let _ = vgpu_license_agent::cli::token::render("x", &t, t.validity(now));
        let targets = vgpu_license_agent::probe::targets(&t);
        assert!(targets.len() <= 2 * t.nodes.len());
    }
    let conf = GriddConf::parse(input);
    assert_eq!(conf.to_bytes(), input, "gridd.conf is kept byte for byte");
    let _ = conf.proxy();
    let _ = conf.warnings(std::path::Path::new("/etc/nvidia/ClientConfigToken"));
    let escaped = vgpu_license_model::text::escape(&text);
    assert!(!escaped.chars().any(char::is_control), "{escaped:?}");
    // `\u{9f}` for a 2-byte character, `\u{1f}` for a 1-byte one: at most 6 bytes a byte.
    assert!(escaped.len() <= 6 * text.len());
    let shown = vgpu_license_model::text::for_terminal(&text);
    assert!(shown.len() <= 6 * text.len());
    let _ = journal::classify(&text);
    let _ = journal::reason_of_error(&text);
    let _ = smi::classify_status(&text);
    let _ = smi::expiry_in(&text);
    let _ = vgpu_license_model::time::parse_gmt(&text);
    let _ = serde_json::from_value::<LogTime>(serde_json::Value::String(text.to_string()));
    let _ = vgpu_license_agent::install::source::from_base64(&text);
    let report = evaluate(Observations {
        smi: snap,
        log: Some((fold, stats)),
        ..Observations::default()
    });
    assert!(
        report.events.len() <= 50,
        "{} events kept",
        report.events.len()
    );
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

/// The heap work of the calling thread: allocations, and the bytes they asked for (a
/// reallocation asks for its whole new size). Counted per thread, so the tests running
/// beside one do not count in it.
struct CountingAlloc;

thread_local! {
    static HEAP_WORK: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

fn count_alloc(bytes: usize) {
    // `try_with`: an allocation while the thread's locals are torn down is not counted.
    let _ = HEAP_WORK.try_with(|w| {
        let (n, b) = w.get();
        w.set((n + 1, b + bytes as u64));
    });
}

// SAFETY: every call is passed on to the system allocator unchanged; the counting touches
// a thread-local Cell only, which neither allocates nor can be reentered.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_alloc(layout.size());
        // SAFETY: the caller's guarantees, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_alloc(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_alloc(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// The allocations and bytes allocated by `f` on this thread.
fn heap_work(f: impl FnOnce()) -> (u64, u64) {
    let (n0, b0) = HEAP_WORK.with(Cell::get);
    f();
    let (n1, b1) = HEAP_WORK.with(Cell::get);
    (n1 - n0, b1 - b0)
}

/// Work for 8 times the input over work for the input once. A parser that handles each line
/// once gives 8 or less (less where a fixed part, its first buffers, weighs in; a buffer
/// that doubles may ask for up to twice its final size, so up to 16 in bytes); one that goes
/// back over what it has read for every new line (a copy of the rest of its buffer, a
/// string rebuilt from the start) about 64. Returns (allocations, bytes).
fn growth(unit: &[u8], parse: impl Fn(&[u8])) -> (f64, f64) {
    let small = unit.repeat(64);
    let large = unit.repeat(512);
    let (n1, b1) = heap_work(|| parse(&small));
    let (n8, b8) = heap_work(|| parse(&large));
    (n8 as f64 / n1.max(1) as f64, b8 as f64 / b1.max(1) as f64)
}

/// Above this, the work for 8 times the input grew faster than the input (see [`growth`]).
const GROWTH_BOUND: f64 = 20.0;

/// The parsers' work counted, not timed (a timing says as much of the machine's load as of
/// the parser): `bench/journal.py` times `analyze` on 1 and 8 times an input.
#[test]
fn parsing_work_grows_linearly() {
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
        let (allocs, bytes) = growth(&unit, |input| {
            let mut fold = LogFold::new(100);
            journal::scan(input, |e| fold.push(e)).unwrap();
        });
        assert!(
            allocs < GROWTH_BOUND && bytes < GROWTH_BOUND,
            "journal: 8x the input took {allocs:.1}x the allocations and {bytes:.1}x the bytes \
             allocated for {:?}",
            String::from_utf8_lossy(&shape[..30])
        );
    }
    let smi_shapes: &[&[u8]] = &[
        b"GPU 00000000:02:01.0\n    Product Name : GRID A100-4C\n    vGPU Software Licensed Product\n        License Status : Licensed (Expiry: 2022-5-27 0:8:28 GMT)\n",
        b"License Status : Licensed (Expiry: ((((((((((((((((((((((((",
    ];
    for shape in smi_shapes {
        let unit = shape.repeat(100);
        let (allocs, bytes) = growth(&unit, |input| {
            smi::parse(input).unwrap();
        });
        assert!(
            allocs < GROWTH_BOUND && bytes < GROWTH_BOUND,
            "smi: 8x the input took {allocs:.1}x the allocations and {bytes:.1}x the bytes \
             allocated for {:?}",
            String::from_utf8_lossy(&shape[..30])
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

fn events_of(r: impl std::io::Read) -> Vec<(String, Option<LogTime>)> {
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

// ---------------------------------------------------------------------------------------
// The config file: every key the config knows, with any TOML value, loaded as the binary
// loads it.

/// The names listed after an unknown one in the config's own error (`unknown field `x`,
/// expected one of `a`, `b``, or `expected `a` or `b``).
fn expected_names(text: &str) -> Vec<String> {
    let e = Settings::default().apply_toml(text).unwrap_err();
    let names: Vec<String> = e
        .split('`')
        .skip(1)
        .step_by(2)
        .skip(1)
        .map(String::from)
        .collect();
    assert!(!names.is_empty(), "no names in {e:?}");
    names
}

/// Every (section, key) of the config, as its parser knows them: nothing to keep in step.
fn config_keys() -> Vec<(String, String)> {
    let mut keys = Vec::new();
    for section in expected_names("no_such_section = 1\n") {
        for key in expected_names(&format!("[{section}]\nno_such_key = 1\n")) {
            keys.push((section.clone(), key));
        }
    }
    keys
}

/// The (section, key) pairs packaging's config.toml documents, as `#key = default` or
/// `# e.g. key = value`.
fn documented_keys() -> Vec<(String, String)> {
    let text = include_str!("../packaging/config.toml");
    let mut section = String::new();
    let mut keys = Vec::new();
    for line in text.lines() {
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let body = line.trim_start_matches('#').trim();
        let body = body.strip_prefix("e.g. ").unwrap_or(body);
        if let Some((key, _)) = body.split_once(" = ")
            && !key.is_empty()
            && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        {
            keys.push((section.clone(), key.to_string()));
        }
    }
    keys
}

#[test]
fn every_config_key_is_documented_and_every_documented_key_is_known() {
    let mut known = config_keys();
    let mut documented = documented_keys();
    // Kept out of the default config and the man page: the tests' own (see config.rs).
    let hidden = (
        "service".to_string(),
        "first_token_look_seconds".to_string(),
    );
    assert!(known.contains(&hidden), "{known:?}");
    documented.push(hidden);
    known.sort();
    documented.sort();
    assert_eq!(known, documented);
    assert!(known.len() >= 27, "{known:?}");
    // NUMERIC_KEYS above is every key that takes a number: an integer is refused with a
    // type error by the others.
    let mut numeric: Vec<(String, String)> = known
        .into_iter()
        .filter(|(section, key)| {
            let mut s = Settings::default();
            !s.apply_toml(&format!("[{section}]\n{key} = 1\n"))
                .is_err_and(|e| e.contains("invalid type"))
        })
        .collect();
    numeric.sort();
    let mut listed: Vec<(String, String)> = NUMERIC_KEYS
        .iter()
        .map(|(s, k)| (s.to_string(), k.to_string()))
        .collect();
    listed.sort();
    assert_eq!(numeric, listed);
}

/// The defaults packaging's config.toml shows (`#key = value`) are the defaults.
#[test]
fn the_documented_defaults_are_the_defaults() {
    let text: String = include_str!("../packaging/config.toml")
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest)
                if rest
                    .split_once(" = ")
                    .is_some_and(|(k, _)| !k.contains(' ')) =>
            {
                rest
            }
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, &text).unwrap();
    let loaded = vgpu_license_agent::config::load(&path).unwrap();
    let mut expected = Settings::default();
    expected.gridd.feature_type_configured = true;
    assert_eq!(loaded, expected);
}

/// Strings a config value may hold: URLs with credentials, paths with control characters,
/// addresses, the defaults themselves.
const CONFIG_STRINGS: &[&str] = &[
    "https://user:s3cret@host/?k=tok",
    "http://user:s3cret@10.0.0.5:8080/hook?sig=tok",
    "http://127.0.0.1:9/x",
    "/etc/nvidia/ClientConfigToken",
    "/etc/nvidia/ClientConfigToken/sub",
    "/var/lib/vgpu-license-agent",
    "/run/x/\u{1b}[2J\u{1b}]0;title\u{7}",
    "/x\n/y\r\u{202e}z",
    "/\0",
    "/",
    "",
    ".",
    "..",
    "a/b",
    "relative",
    "client_configuration_token.tok",
    "127.0.0.1:9841",
    "[::1]:0",
    "0.0.0.0:99999",
    "nvidia-smi",
    "systemctl",
];

/// Values that TOML reads but no typed value holds, or that TOML itself refuses.
const CONFIG_RAW: &[&str] = &[
    "99999999999999999999999",
    "-9223372036854775809",
    "0x7fffffffffffffff",
    "1e400",
    "nan",
    "-inf",
    "1979-05-27T07:32:00Z",
    "07:32:00",
    "\"\"\"multi\nline\"\"\"",
    "'literal \\ string'",
    "[1, \"mixed\", [true]]",
    "{}",
    "",
    "\"unterminated",
];

fn toml_leaf() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(CONFIG_STRINGS).prop_map(|s| toml::Value::from(s).to_string()),
        any::<String>().prop_map(|s| toml::Value::from(s).to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        (0i64..100_000).prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| toml::Value::from(v).to_string()),
        prop::sample::select(CONFIG_RAW).prop_map(String::from),
    ]
}

/// A TOML value as text: leaves, arrays and inline tables of them.
fn toml_value() -> impl Strategy<Value = String> {
    toml_leaf().prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec(("[a-z_]{1,6}", inner), 0..3).prop_map(|kv| {
                let kv: Vec<String> = kv.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                format!("{{ {} }}", kv.join(", "))
            }),
        ]
    })
}

/// Loads `main` (and `dropin` as config.d/50-x.toml) as the binary does.
fn load_config(
    main: &[u8],
    dropin: Option<&[u8]>,
) -> Result<Settings, vgpu_license_model::config::ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, main).unwrap();
    if let Some(d) = dropin {
        std::fs::create_dir(dir.path().join("config.d")).unwrap();
        std::fs::write(dir.path().join("config.d/50-x.toml"), d).unwrap();
    }
    vgpu_license_agent::config::load(&path)
}

/// A loaded config holds only what its own checks allow; an error is one line, escaped.
fn loaded_or_refused(r: &Result<Settings, vgpu_license_model::config::ConfigError>) -> String {
    match r {
        Ok(s) => {
            durations_are_safe(s);
            assert!(matches!(s.gridd.feature_type, 0 | 1 | 2 | 4));
            assert!(!s.commands.restart_gridd.is_empty());
            assert!(s.paths.token_dir.is_absolute() && s.paths.state_dir.is_absolute());
            assert!(!s.paths.token_file.is_empty() && !s.paths.token_file.contains('/'));
            String::new()
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
            shown
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_value_in_any_config_key_is_taken_or_refused(
        (section, key) in prop::sample::select(config_keys()),
        value in toml_value(),
    ) {
        let text = format!("[{section}]\n{key} = {value}\n");
        let shown = loaded_or_refused(&load_config(text.as_bytes(), None));
        // A refusal names the key it refuses (or a line of the value, when TOML cannot read
        // it: a multi-line string moves the error past line 2).
        let line = shown
            .split_once("line ")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<usize>().ok());
        prop_assert!(
            shown.is_empty()
                || shown.contains(&key)
                || line.is_some_and(|n| (2..=text.lines().count() + 1).contains(&n)),
            "{text:?} -> {shown}"
        );
    }

    #[test]
    fn any_values_in_several_keys_and_a_dropin_are_taken_or_refused(
        main in prop::collection::vec((prop::sample::select(config_keys()), toml_value()), 0..6),
        dropin in prop::collection::vec((prop::sample::select(config_keys()), toml_value()), 0..4),
    ) {
        // Dotted keys: one key twice is a TOML error, which is refused like any other.
        let text = |kv: &[((String, String), String)]| -> String {
            kv.iter().map(|((s, k), v)| format!("{s}.{k} = {v}\n")).collect()
        };
        let (main, dropin) = (text(&main), text(&dropin));
        loaded_or_refused(&load_config(main.as_bytes(), Some(dropin.as_bytes())));
    }

    #[test]
    fn any_text_as_the_config_file_is_taken_or_refused(
        input in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..512),
            prop::collection::vec(
                prop_oneof![
                    prop::sample::select(&[
                        "[paths]\n", "[service]\n", "[commands]\n", "[gridd]\n", "[[paths]]\n",
                        "token_dir", "timeout_seconds", "webhook_url", " = ", "=", "\"", "'",
                        "\"\"\"", "[", "]", "{", "}", ",", "#", "\n", "\\u0000", "\\",
                        "9223372036854775807", "-1", "1.5", "true", "https://u:p@h/?k=v",
                    ][..]).prop_map(String::from),
                    any::<String>(),
                ],
                0..32,
            ).prop_map(|v| v.concat().into_bytes()),
        ],
    ) {
        loaded_or_refused(&load_config(&input, None));
        let _ = Settings::default().apply_toml(&String::from_utf8_lossy(&input));
    }
}

// ---------------------------------------------------------------------------------------
// The command line: every flag that takes a string, a path or a URL.

/// Every flag that takes a string, a path or a URL, after what it needs: the value follows.
const STRING_FLAGS: &[&[&str]] = &[
    &["status", "--config"],
    &["install", "--token-url"],
    &["install", "--token-base64"],
    &["install", "--token-file"],
    &["install", "--token-url", "https://x/t", "--ca-file"],
    &["analyze", "--smi"],
    &["analyze", "--journal"],
    &["analyze", "--app-log"],
    &["analyze", "--smi", "x", "--token"],
    &["token", "inspect"],
    &["check-identity", "--root"],
    // --dry-run first: a fuzzed root must never be cleaned.
    &["prepare-image", "--dry-run", "--root"],
];

/// Every argument of every command that takes a value: (the commands above it, `--long`,
/// or the command path alone for a positional one).
fn value_args() -> Vec<(Vec<String>, Option<String>)> {
    fn walk(
        cmd: &clap::Command,
        path: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, Option<String>)>,
    ) {
        for arg in cmd.get_arguments() {
            let takes = arg.get_action().takes_values();
            // A global argument is checked where it is defined.
            if takes && (path.is_empty() || !arg.is_global_set()) {
                out.push((path.clone(), arg.get_long().map(|l| format!("--{l}"))));
            }
        }
        for sub in cmd.get_subcommands() {
            path.push(sub.get_name().to_string());
            walk(sub, path, out);
            path.pop();
        }
    }
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = Vec::new();
    walk(&cmd, &mut Vec::new(), &mut out);
    out
}

#[test]
fn every_flag_that_takes_a_value_is_fuzzed() {
    let args = value_args();
    assert!(args.len() >= 14, "{args:?}");
    for (path, long) in args {
        let covered = NUMERIC_FLAGS.iter().chain(STRING_FLAGS).any(|f| {
            f.starts_with(&path.iter().map(String::as_str).collect::<Vec<_>>())
                && match &long {
                    Some(l) => f.last() == Some(&l.as_str()),
                    None => f.len() == path.len(),
                }
        });
        assert!(
            covered,
            "{path:?} {long:?} is in neither NUMERIC_FLAGS nor STRING_FLAGS"
        );
    }
}

fn os_value() -> impl Strategy<Value = std::ffi::OsString> {
    use std::os::unix::ffi::OsStringExt;
    prop_oneof![
        any::<String>().prop_map(Into::into),
        prop::sample::select(CONFIG_STRINGS).prop_map(Into::into),
        prop::sample::select(&["-", "--", "-x", "--help", "--token-url", "=", "--json"][..])
            .prop_map(Into::into),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(std::ffi::OsString::from_vec),
    ]
}

/// A URL with credentials in each place they hide, in forms that are refused before any
/// connection is made (not https, not parsable), and the secrets it holds.
fn refused_url() -> impl Strategy<Value = (String, String, String)> {
    (
        prop::sample::select(
            &[
                "http", "HTTP", "ftp", "file", "ws", "gopher", "h ttp", "https:", "",
            ][..],
        ),
        prop::sample::select(
            &[
                "10.0.0.5",
                "dls.example",
                "",
                "[::1",
                "a b",
                "%zz",
                "h:99999",
            ][..],
        ),
        "[A-Za-z0-9]{4,10}",
        "[A-Za-z0-9]{4,10}",
        prop::sample::select(&["/", "/t.tok", "/%00\n", ""][..]),
    )
        .prop_map(|(scheme, host, pw, q, path)| {
            let (pw, q) = (format!("PW{pw}"), format!("QS{q}"));
            (
                format!("{scheme}://user:{pw}@{host}{path}?sig={q}#frag"),
                pw,
                q,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_string_in_any_flag_is_parsed_or_refused(
        flag in prop::sample::select(STRING_FLAGS),
        value in os_value(),
    ) {
        use clap::Parser;
        let mut args: Vec<std::ffi::OsString> = vec!["vgpu-license-agent".into()];
        args.extend(flag.iter().map(Into::into));
        args.push(value);
        match Cli::try_parse_from(&args) {
            Ok(cli) => {
                if let vgpu_license_agent::cli::Command::Install(a) = cli.command
                    && let Some(text) = &a.source.token_base64
                {
                    // Nothing of the token's text is put in a message.
                    if let Err(e) = vgpu_license_agent::install::source::from_base64(text) {
                        let e = e.to_string();
                        let compact: String =
                            text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
                        // (The advice names the token's usual file name: that is not an echo.)
                        let advice = vgpu_license_agent::install::source::from_base64("!")
                            .unwrap_err()
                            .to_string();
                        prop_assert!(
                            compact.len() < 16 || !e.contains(&compact) || advice.contains(&compact),
                            "{e}"
                        );
                    }
                }
            }
            Err(e) => {
                let _ = e.render().to_string();
            }
        }
    }

    #[test]
    fn a_refused_token_url_never_shows_its_credentials((url, pw, q) in refused_url()) {
        use vgpu_license_agent::http::allowed;
        let refused_at_once = reqwest::Url::parse(url.trim()).map_or(true, |u| !allowed(&u));
        prop_assert!(refused_at_once, "{url}");
        let e = vgpu_license_agent::install::fetch::fetch(
            &url,
            None,
            Duration::from_secs(1),
            0,
        )
        .unwrap_err()
        .to_string();
        prop_assert!(!e.contains(&pw) && !e.contains(&q), "{url} -> {e}");
        prop_assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn any_bytes_as_the_ca_file_are_taken_or_refused(
        pem in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            (prop::collection::vec(any::<u8>(), 0..600), any::<bool>()).prop_map(|(body, end)| {
                use base64::Engine as _;
                let b64 = base64::engine::general_purpose::STANDARD.encode(body);
                let mut pem = format!("-----BEGIN CERTIFICATE-----\n{b64}\n").into_bytes();
                if end {
                    pem.extend_from_slice(b"-----END CERTIFICATE-----\n");
                }
                pem
            }),
        ],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, &pem).unwrap();
        let url = reqwest::Url::parse("https://dls.example/t.tok").unwrap();
        if let Err(e) = vgpu_license_agent::http::client(&url, Some(&path), Duration::from_secs(1)) {
            prop_assert!(!e.to_string().contains('\n'), "{e}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// What the agent reads back from its own files: status.json, identity.json and the clone
// record, whatever they hold.

/// A JSON value with any shape, from leaves that reports hold.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        any::<String>().prop_map(Value::from),
        prop::sample::select(JSON_STRINGS).prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,10}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

const JSON_STRINGS: &[&str] = &[
    "licensed",
    "failing",
    "restricted",
    "unknown",
    "acquired",
    "acquire_failed",
    "clock_skew",
    "dls_unreachable",
    "vgpu-license-agent/report/v1",
    "2024-12-20T17:53:32Z",
    "2024-12-20T17:53:32",
    "+262143-12-31T23:59:59Z",
    "9999-99-99T99:99:99Z",
    "\u{1b}[2J\n\r\u{202e}",
    "nls",
    "legacy",
];

/// `doc` with the value at one place (the `pick`th, in document order) replaced by `with`.
fn mutate(doc: &mut serde_json::Value, pick: usize, with: serde_json::Value) {
    use serde_json::Value;
    fn children(v: &mut Value) -> Vec<&mut Value> {
        match v {
            Value::Array(a) => a.iter_mut().collect(),
            Value::Object(m) => m.values_mut().collect(),
            _ => Vec::new(),
        }
    }
    fn count(v: &mut Value) -> usize {
        1 + children(v).into_iter().map(count).sum::<usize>()
    }
    fn replace(v: &mut Value, n: &mut usize, with: &mut Option<Value>) {
        if *n == 0 {
            if let Some(w) = with.take() {
                *v = w;
            }
            return;
        }
        *n -= 1;
        for c in children(v) {
            if with.is_none() {
                return;
            }
            replace(c, n, with);
        }
    }
    let mut n = pick % count(doc);
    replace(doc, &mut n, &mut Some(with));
}

/// A report as the service writes it, then changed at a few places.
fn status_json() -> impl Strategy<Value = Vec<u8>> {
    (
        pieces(),
        prop::collection::vec((any::<usize>(), json_value()), 0..4),
        any::<bool>(),
    )
        .prop_map(|(log, changes, pretty)| {
            let mut fold = LogFold::new(50);
            let stats = journal::scan(&log[..], |e| fold.push(e)).unwrap();
            let report = evaluate(Observations {
                smi: smi::parse(&log).ok(),
                log: Some((fold, stats)),
                ..Observations::default()
            });
            let mut doc = serde_json::to_value(&report).unwrap();
            doc["agent_pid"] = serde_json::Value::from(std::process::id());
            for (pick, with) in changes {
                mutate(&mut doc, pick, with);
            }
            if pretty {
                serde_json::to_vec_pretty(&doc).unwrap()
            } else {
                serde_json::to_vec(&doc).unwrap()
            }
        })
}

fn state_settings(dir: &std::path::Path) -> Settings {
    let mut s = Settings::default();
    s.paths.status_file = dir.join("status.json");
    s.paths.state_dir = dir.join("state");
    s.paths.gridd_client_state = vec![dir.join("GridLicensing")];
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// `status` takes a status.json only from a running service (never this test), but
    /// whatever a report says, reading it, showing it and its exit code are safe.
    #[test]
    fn any_status_json_is_read_shown_or_ignored(
        bytes in prop_oneof![prop::collection::vec(any::<u8>(), 0..1024), status_json()],
    ) {
        use vgpu_license_model::report::{Report, human, metrics};
        let dir = tempfile::tempdir().unwrap();
        let settings = state_settings(dir.path());
        std::fs::write(&settings.paths.status_file, &bytes).unwrap();
        prop_assert!(vgpu_license_agent::cli::status::from_service(&settings).is_none());
        if let Ok(report) = serde_json::from_slice::<Report>(&bytes) {
            let shown = human::render(&report);
            // What a person reads says the state first, and carries no control character
            // of the file's (an escape sequence, a carriage return) to the terminal.
            prop_assert!(shown.starts_with("State:"), "{shown}");
            let safe = vgpu_license_model::text::for_terminal(&shown);
            prop_assert!(
                !safe.chars().any(|c| c != '\n' && c.is_control()),
                "{safe:?}"
            );
            let _ = metrics::render(&report, &metrics::Counters::from_events(&report));
            // systemd's status line names the state first too.
            let line = vgpu_license_agent::service::status_line(&report);
            prop_assert!(line.starts_with(report.state.as_str()), "{line}");
        }
    }

    #[test]
    fn any_identity_or_clone_record_is_read_or_ignored(
        identity in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
            (any::<usize>(), json_value()).prop_map(|(pick, with)| {
                let mut doc = serde_json::json!({
                    "machine_id": "0123", "product_uuid": "abcd", "macs": ["52:54:00:00:00:01"]
                });
                mutate(&mut doc, pick, with);
                serde_json::to_vec(&doc).unwrap()
            }),
        ],
        clone in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            (any::<usize>(), json_value()).prop_map(|(pick, with)| {
                let id = serde_json::json!({"machine_id": "0123", "product_uuid": null, "macs": []});
                let mut doc = serde_json::json!({
                    "at": "2024-12-20T17:53:32Z", "old": id, "new": id, "moved_to": "/x\n/y"
                });
                mutate(&mut doc, pick, with);
                serde_json::to_vec(&doc).unwrap()
            }),
        ],
    ) {
        use vgpu_license_agent::identity;
        let dir = tempfile::tempdir().unwrap();
        let settings = state_settings(dir.path());
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/machine-id"), "4567\n").unwrap();
        std::fs::create_dir_all(&settings.paths.state_dir).unwrap();
        let state = &settings.paths.state_dir;
        std::fs::write(state.join(identity::IDENTITY_FILE), &identity).unwrap();
        std::fs::write(state.join(identity::CLONE_FILE), &clone).unwrap();
        if let Some(c) = identity::take_unreported(&settings) {
            let m = vgpu_license_model::text::escape(&c.message()).into_owned();
            prop_assert!(!m.contains('\n'), "{m}");
        }
        let _ = identity::check(&settings, &root);
    }
}

// ---------------------------------------------------------------------------------------
// The service's journal reader: `journalctl -o json` lines with any fields and any values.

/// gridd's messages, so that entries that pass journald's checks become events.
const GRIDD_MESSAGES: &[&str] = &[
    "License acquired successfully. (Info: dls.example, NVIDIA RTX Virtual Workstation; Expiry: 2024-12-21 16:53:33 GMT)",
    "Failed to acquire license from dls.example (Info: NVIDIA RTX Virtual Workstation - Error: Clock windback has been detected)",
    "Failed to acquire license from 10.0.0.5",
    "Acquiring license. (Info: dls.example; NVIDIA RTX Virtual Workstation)",
    "License returned successfully. (Info: dls.example)",
    "NLS initialized",
    "Shutdown ... Releasing license",
];

const JOURNAL_KEYS: &[&str] = &[
    "_UID",
    "_COMM",
    "_EXE",
    "_SYSTEMD_UNIT",
    "SYSLOG_IDENTIFIER",
    "MESSAGE",
    "__REALTIME_TIMESTAMP",
    "_PID",
    "SYSLOG_PID",
    "PRIORITY",
];

const JOURNAL_VALUES: &[&str] = &[
    "0",
    "00",
    "65534",
    "nvidia-gridd",
    "nvidia-gridd ",
    "NVIDIA-GRIDD",
    "/usr/bin/nvidia-gridd",
    "nvidia-gridd/nvidia-gridd",
    "/tmp/evil-nvidia-gridd",
    "nvidia-gridd.service",
    "user@1000.service",
    "1734716012000000",
    "-1",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999",
    "4294967296",
    "12",
];

fn journal_field_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    prop_oneof![
        3 => prop::sample::select(JOURNAL_VALUES).prop_map(Value::from),
        2 => prop::sample::select(GRIDD_MESSAGES).prop_map(Value::from),
        // MESSAGE as journald writes text that is not UTF-8: an array of bytes.
        1 => prop::collection::vec(any::<u16>().prop_map(|n| n % 300), 0..40).prop_map(Value::from),
        1 => pieces().prop_map(|b| Value::from(String::from_utf8_lossy(&b).into_owned())),
        2 => json_value(),
    ]
}

/// Fields that nearly say gridd, and fields that do.
const NEAR_MISSES: &[(&str, &str)] = &[
    ("_UID", "00"),
    ("_UID", "1000"),
    ("_COMM", "nvidia-gridd "),
    ("_COMM", "nvidia-gridd"),
    ("_EXE", "/tmp/evil-nvidia-gridd"),
    ("_EXE", "nvidia-gridd"),
    ("_EXE", "/usr/bin/nvidia-gridd"),
    ("_SYSTEMD_UNIT", "user@1000.service"),
    ("_SYSTEMD_UNIT", "nvidia-gridd.service"),
    ("SYSLOG_IDENTIFIER", "nvidia-gridd"),
    ("SYSLOG_IDENTIFIER", "logger"),
];

/// One entry: mostly one of gridd's, as journald writes it (naming the process by one of
/// its fields), with fields changed, removed or added.
fn journal_entry() -> impl Strategy<Value = serde_json::Map<String, serde_json::Value>> {
    (
        any::<bool>(),
        prop::sample::select(NEAR_MISSES),
        prop::sample::select(GRIDD_MESSAGES),
        prop::collection::vec(
            prop_oneof![
                2 => prop::sample::select(NEAR_MISSES)
                    .prop_map(|(k, v)| (k.to_string(), Some(serde_json::Value::from(v)))),
                3 => (
                    prop_oneof![
                        4 => prop::sample::select(JOURNAL_KEYS).prop_map(String::from),
                        1 => "[A-Z_]{1,8}",
                    ],
                    prop::option::weighted(0.8, journal_field_value()),
                ),
            ],
            0..5,
        ),
    )
        .prop_map(|(gridd, (who, name), message, changes)| {
            let mut m = serde_json::Map::new();
            if gridd {
                m.insert("_UID".into(), "0".into());
                m.insert(who.into(), name.into());
                m.insert("MESSAGE".into(), message.into());
                m.insert("__REALTIME_TIMESTAMP".into(), "1734716012000000".into());
            }
            for (k, v) in changes {
                match v {
                    Some(v) => m.insert(k, v),
                    None => m.remove(&k),
                };
            }
            m
        })
}

/// Lines of `journalctl -o json`, and lines that are not (text, a cut entry), never the first.
fn journal_lines() -> impl Strategy<Value = Vec<String>> {
    (
        journal_entry(),
        prop::collection::vec(
            prop_oneof![
                6 => journal_entry().prop_map(|m| serde_json::to_string(&m).unwrap()),
                1 => journal_entry().prop_map(|m| {
                    let s = serde_json::to_string(&m).unwrap();
                    let cut = s.len() / 2;
                    String::from_utf8_lossy(&s.as_bytes()[..cut]).into_owned()
                }),
                1 => Just("Dec 20 17:53:32 host nvidia-gridd[1]: Failed to acquire license from x (Info: y - Error: Clock windback has been detected)".to_string()),
                1 => any::<String>(),
            ],
            0..24,
        ),
    )
        .prop_map(|(first, rest)| {
            std::iter::once(serde_json::to_string(&first).unwrap())
                .chain(rest)
                .map(|l| l.replace('\n', " "))
                .collect()
        })
}

/// Whether journald's own fields show that nvidia-gridd sent `entry` (the spec of class 6
/// of issue 8): `_UID` is root's and, where journald knew the process, it was gridd.
fn vouched(entry: &serde_json::Value, journal: bool) -> bool {
    let s = |k: &str| entry.get(k).map(|v| v.as_str());
    match s("_UID") {
        Some(uid) if uid != Some("0") => return false,
        None if journal => return false,
        _ => {}
    }
    let process = [
        s("_COMM").map(|v| v == Some("nvidia-gridd")),
        s("_EXE").map(|v| v.is_some_and(|e| e.ends_with("/nvidia-gridd"))),
        s("_SYSTEMD_UNIT").map(|v| v == Some("nvidia-gridd.service")),
    ];
    if process.iter().any(Option::is_some) {
        process.contains(&Some(true))
    } else {
        s("SYSLOG_IDENTIFIER") == Some(Some("nvidia-gridd"))
    }
}

fn journal_events_of(r: impl std::io::Read) -> Vec<journal::GriddEvent> {
    let mut out = Vec::new();
    journal::scan_journal(r, |e| out.push(e)).unwrap();
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whole, trickled 1 to 7 bytes at a time, or line by line as the service feeds its
    /// `journalctl --follow`: the same events.
    #[test]
    fn journal_json_gives_the_same_events_however_it_arrives(
        lines in journal_lines(),
        crlf in any::<bool>(),
        step in 1usize..8,
    ) {
        let eol = if crlf { "\r\n" } else { "\n" };
        let data: Vec<u8> = lines.iter().flat_map(|l| [l.as_str(), eol]).collect::<String>().into_bytes();
        let whole = journal_events_of(&data[..]);
        prop_assert_eq!(&whole, &journal_events_of(Trickle { data: &data, step }));
        let mut fed = Vec::new();
        let mut parser = journal::LineParser::new(|e| fed.push(e));
        // Only the lines that name nvidia-gridd are parsed by the bulk reader.
        for l in lines.iter().filter(|l| l.contains("nvidia-gridd")) {
            parser.feed(l.as_bytes());
        }
        drop(parser);
        prop_assert_eq!(&whole, &fed);
    }

    /// An entry becomes an event exactly when journald vouches that gridd sent it and it has
    /// a message; nothing else does, whatever the fields say.
    #[test]
    fn only_what_journald_vouches_for_is_gridds(lines in journal_lines(), export in any::<bool>()) {
        use std::cell::RefCell;
        let events = RefCell::new(Vec::new());
        let trust = if export { journal::Trust::Export } else { journal::Trust::Journal };
        let mut parser = journal::LineParser::with_trust(|e| events.borrow_mut().push(e), trust);
        let (mut total, mut bytes) = (0, 0);
        for l in &lines {
            let before = events.borrow().len();
            parser.feed(l.as_bytes());
            let made = events.borrow().len() - before;
            prop_assert!(made <= 1, "{made} events from {l:?}");
            total += made;
            bytes += l.len();
            if let Ok(entry) = serde_json::from_str::<serde_json::Value>(l)
                && entry.is_object()
            {
                let message = matches!(
                    entry.get("MESSAGE"),
                    Some(serde_json::Value::String(_) | serde_json::Value::Array(_))
                );
                prop_assert_eq!(made == 1, vouched(&entry, !export) && message, "{}", l);
            } else if !export {
                prop_assert_eq!(made, 0, "text in the journal stream: {}", l);
            }
        }
        // Bounded: one event a line, no event's text longer than 3 bytes a byte of its line.
        let message_bytes: usize = events.borrow().iter().map(|e| e.message.len()).sum();
        prop_assert!(total <= lines.len());
        prop_assert!(message_bytes <= 3 * bytes);
        let stats = parser.stats().clone();
        drop(parser);
        prop_assert_eq!(stats.gridd_lines, total as u64);
        let _ = vgpu_license_model::shutdown::judge(&events.borrow());
    }

    #[test]
    fn any_bytes_in_the_journal_stream_never_panic(
        input in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            pieces(),
        ],
    ) {
        let mut n = 0;
        let stats = journal::scan_journal(&input[..], |_| n += 1).unwrap();
        prop_assert!(n <= input.iter().filter(|b| **b == b'\n').count() + 1);
        prop_assert_eq!(stats.bytes, input.len() as u64);
        let mut parser = journal::LineParser::new(|_| n += 1);
        for l in input.split(|b| *b == b'\n') {
            parser.feed(l);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The metrics endpoint's request parser: whatever a client sends.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_request_to_the_metrics_endpoint_gets_a_bounded_answer(
        request in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..1024),
            prop::collection::vec(
                prop_oneof![
                    prop::sample::select(&[
                        "GET ", "HEAD ", "POST ", "/metrics", "http://h/metrics", "?x#y", " HTTP/1.1",
                        " HTTP/1.0", "\r\n", "\n", "Accept: ", "accept:", "application/openmetrics-text",
                        "text/plain", "*/*", ";q=", "0.5", "1.5", "nan", ";version=1.0.0", ",", " ",
                        "\"", "\u{0}",
                    ][..]).prop_map(String::from),
                    any::<String>(),
                ],
                0..24,
            ).prop_map(|v| v.concat().into_bytes()),
        ],
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use vgpu_license_model::report::metrics;
        use vgpu_license_agent::service::metrics_server;
        let report = evaluate(Observations::default());
        let text = metrics::render(&report, &metrics::Counters::from_events(&report));
        let _ = metrics_server::negotiate(Some(&String::from_utf8_lossy(&request)));
        // The whole server, as a client that sends this and closes its side sees it.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let answer = rt.block_on(async {
            let (mut client, server) = tokio::io::duplex(64 * 1024);
            let served = tokio::spawn({
                let text = text.clone();
                async move { metrics_server::answer(server, &text).await }
            });
            let _ = client.write_all(&request).await;
            let _ = client.shutdown().await;
            let mut answer = Vec::new();
            let _ = client.read_to_end(&mut answer).await;
            let _ = served.await;
            answer
        });
        // One answer, or none for a request that never ended.
        prop_assert!(answer.is_empty() || answer.starts_with(b"HTTP/1."), "{:?}", String::from_utf8_lossy(&answer));
        // The answer is the metrics or a short error: nothing of the request comes back.
        let body = text.len().max(metrics::openmetrics(&text).len());
        prop_assert!(answer.len() <= body + 256, "{} bytes", answer.len());
    }
}
/// A URL with credentials, under any key in any form, and the secrets it holds.
fn credential_url() -> impl Strategy<Value = (String, String, String)> {
    (
        prop::sample::select(&["https", "http", "ftp"][..]),
        prop::sample::select(&["host", "10.0.0.5", "127.0.0.1:9841", "h.example:8443"][..]),
        "[A-Za-z0-9]{4,10}",
        "[A-Za-z0-9]{4,10}",
    )
        .prop_map(|(scheme, host, pw, q)| {
            let (pw, q) = (format!("PW{pw}"), format!("QS{q}"));
            (format!("{scheme}://user:{pw}@{host}/?k={q}"), pw, q)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever key a URL with credentials is put under, and however, a refusal shows
    /// neither its password nor its query.
    #[test]
    fn config_errors_never_echo_a_credential(
        (section, key) in prop::sample::select(config_keys()),
        (url, pw, q) in credential_url(),
        form in 0usize..7,
    ) {
        let u = toml::Value::from(url.as_str()).to_string();
        let text = match form {
            0 => format!("[{section}]\n{key} = {u}\n"),
            1 => format!("[{section}]\n{key} = [{u}]\n"),
            2 => format!("[{section}]\n{key} = {{ x = {u} }}\n"),
            3 => format!("[{section}]\n{u} = 1\n"),
            4 => format!("[{section}]\n{key} = {u}\n{key} = 2\n"),
            5 => format!("[{section}]\n{key} = \"{url}\n"),
            _ => format!("[{section}]\n{key} = -1 # {url}\n"),
        };
        if let Err(e) = load_config(text.as_bytes(), None) {
            let shown = e.to_string();
            prop_assert!(!shown.contains(&pw) && !shown.contains(&q), "{text:?} -> {shown}");
        }
    }
}
