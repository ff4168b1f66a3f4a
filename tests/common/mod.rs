//! Helpers shared by the CLI test files (each file is its own crate and uses a subset).
#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// Runs the built `dstwin` binary with `args` and collects its output.
pub fn dstwin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(args)
        .output()
        .expect("run dstwin")
}

/// A file under tests/data.
pub fn data(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A test's directory under the system's temporary directory ([`tmp_dir`]), removed when the
/// test is done with it. A failing test leaves it in place (its path is in the failure's
/// output), so that what the command wrote can be looked at.
pub struct TmpDir(PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TmpDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TmpDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

/// An empty directory `dstwin-PREFIX-NAME-PID` under the system's temporary directory (the
/// process id keeps two test runs apart), removed when dropped ([`TmpDir`]).
pub fn tmp_dir(prefix: &str, name: &str) -> TmpDir {
    let dir = std::env::temp_dir().join(format!("dstwin-{prefix}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TmpDir(dir)
}

/// A command's standard error as text.
pub fn stderr_text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A file's text; a missing file fails the test with its path.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A running `dstwin serve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: String,
}

impl Server {
    pub fn start(args: &[&str]) -> Server {
        Server::start_env(args, &[])
    }

    /// [`Server::start`] with these environment variables set (and no `VLLM_API_KEY` from the
    /// test's own environment unless given).
    pub fn start_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dstwin"))
            .arg("serve")
            .args(args)
            .args(["--port", "0"])
            .env_remove("VLLM_API_KEY")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dstwin serve");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the listening line");
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Server { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the server as a user does (SIGTERM: in-flight requests finish, a `--profile`
    /// trace is written out) and waits for it to exit.
    pub fn stop(mut self) {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(st.success(), "kill -TERM failed");
        let st = self.child.wait().expect("waiting for dstwin serve");
        assert!(st.success(), "dstwin serve exited with {st}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `dstwin init-weights --preset tiny --seed 1` into a fresh directory ([`TmpDir`]).
pub fn tiny_model(tag: &str) -> TmpDir {
    let dir = tmp_dir("cpu-serve", tag);
    let o = Command::new(env!("CARGO_BIN_EXE_dstwin"))
        .args(["init-weights", "--preset", "tiny", "--seed", "1", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    dir
}

/// The A3 system in `dir`, priced by its cost file plus a `[host]` table of `host` (TOML lines);
/// -> the `hardware=` override that selects it.
pub fn a3_with_host(dir: &std::path::Path, host: &str) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let system = read(&PathBuf::from(format!(
        "{root}/hwmodels/data/systems/atlas-800-a3.toml"
    )))
    .replace(
        "cost_model = \"ascend-910c\"",
        "cost_model = \"costs.toml\"",
    );
    std::fs::write(dir.join("a3.toml"), system).unwrap();
    let costs = read(&PathBuf::from(format!(
        "{root}/hwmodels/data/costs/ascend-910c.toml"
    )));
    // The shipped file's own [host] (eager launches) gives way to the test's.
    let costs = costs.split("\n[host]\n").next().unwrap().to_string();
    std::fs::write(
        dir.join("costs.toml"),
        format!("{costs}\n[host]\n{host}\nsource = \"test\"\n"),
    )
    .unwrap();
    format!("hardware={}", dir.join("a3.toml").display())
}
