//! `token inspect` on the command line: what a token says, never its key or signature, and a
//! one-line error for anything that is not a token.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_vgpu-license-agent");

fn inspect(args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    // An empty config of its own: the defaults, whatever this machine's config says.
    let config = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(config.path())
        .args(["token", "inspect"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(b) = stdin {
        // The agent stops reading past the size of a token: the rest meets a closed pipe.
        if let Err(e) = input.write_all(b) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
        }
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/example.tok")
        .display()
        .to_string()
}

#[test]
fn shows_nodes_and_dates_never_the_signature() {
    let token = std::fs::read_to_string(example()).unwrap();
    let signature = token.trim().rsplit('.').next().unwrap();
    let (code, out, err) = inspect(&[&example()], None);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("dls.example.internal (auth port 443, lease port 443)"),
        "{out}"
    );
    assert!(out.contains("Expires:    2035-11-14 22:13:20 UTC"), "{out}");
    assert!(out.contains("valid now"), "{out}");
    let (code, json, _) = inspect(&["--json", "-"], Some(token.as_bytes()));
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["nodes"][0]["host"], "dls.example.internal");
    assert_eq!(v["expires"], "2035-11-14T22:13:20Z");
    assert_eq!(v["validity"], "valid");
    for text in [&out, &json] {
        assert!(
            !text.contains(&signature[..40]),
            "the signature was printed"
        );
        assert!(!text.contains("PUBLIC KEY"), "key material was printed");
        assert!(!text.contains(&token.trim()[..60]), "the token was printed");
    }
}

#[test]
fn what_is_not_a_token_gets_one_line() {
    let conf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/samples/griddconf-jp-dls-guide-1.txt")
        .display()
        .to_string();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (Vec::new(), "empty"),
        (b"hello world".to_vec(), "three base64url parts"),
        (vec![0xc3, 0x28, 0xff], "invalid UTF-8"),
        (
            vec![b'x'; 10 << 20],
            "far more than a client configuration token",
        ),
    ];
    for (input, want) in cases {
        let (code, out, err) = inspect(&["-"], Some(&input));
        assert_eq!(code, 1, "{want}: {err}");
        assert!(out.is_empty());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{want:?} not in {err:?}");
    }
    let (code, _, err) = inspect(&[&conf], None);
    assert_eq!(code, 1);
    assert!(
        err.contains("this is a gridd.conf, not a client configuration token"),
        "{err}"
    );
    let (code, _, err) = inspect(&["/nonexistent/token.tok"], None);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/token.tok"), "{err}");
}
