//! The real binary as a child process, for what the in-process app cannot
//! show: a SIGKILL, or the peak memory of the whole process.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

use moderato::config::Config;

pub struct ChildServer {
    pub process: std::process::Child,
    pub address: String,
    log: Option<std::thread::JoinHandle<Vec<String>>>,
}

/// An enterprise key allowed `rpm` requests a minute, stored in the
/// database at `database_url` under `config`'s pepper: for driving a child
/// process harder than any plan allows.
pub async fn enterprise_key(
    config: &Config,
    database_url: &str,
    name: &str,
    rpm: u32,
) -> moderato::access::keys::NewKey {
    let store = moderato::store::connect(database_url).await.unwrap();
    let pepper = moderato::load_pepper(config).unwrap();
    let new = moderato::access::keys::generate(&pepper);
    store
        .insert_key(&moderato::access::ApiKeyRecord {
            id: new.id.clone(),
            name: name.into(),
            tier: moderato::access::Tier::Enterprise,
            custom_rpm: Some(rpm),
            owner: moderato::access::KeyOwner::Operator,
            secret_hash: new.secret_hash.clone(),
            created_at: chrono::Utc::now(),
            revoked_at: None,
            policy_id: None,
            policy: None,
        })
        .await
        .unwrap();
    new
}

/// Environment that points the binary at the test's database and files.
pub fn env_for(config: &Config, dir: &Path) -> Vec<(String, String)> {
    vec![
        ("MODERATO_ADDR".into(), "127.0.0.1:0".into()),
        (
            "MODERATO_DATABASE_URL".into(),
            config.database_url.0.clone(),
        ),
        (
            "MODERATO_AUTH__PEPPER_FILE".into(),
            config.auth.pepper_file.display().to_string(),
        ),
        (
            "MODERATO_SIGNING__KEY_FILE".into(),
            config.signing.key_file.display().to_string(),
        ),
        (
            "MODERATO_USAGE__JOURNAL_DIR".into(),
            dir.join("usage-journal").display().to_string(),
        ),
        (
            "MODERATO_MODELS_DIR".into(),
            config.models_dir.display().to_string(),
        ),
        ("MODERATO_LOG_FORMAT".into(), "json".into()),
        ("MODERATO_LOG".into(), "info".into()),
        // Children run side by side: none takes the default metrics port.
        ("MODERATO_METRICS_ADDR".into(), String::new()),
    ]
}

impl ChildServer {
    /// Starts `moderato serve` and waits until it listens.
    pub fn start(env: &[(String, String)]) -> ChildServer {
        ChildServer::spawn(Command::new(env!("CARGO_BIN_EXE_moderato")), env)
    }

    /// Starts `moderato serve` in `dir`, so that the defaults' relative
    /// paths (`data/moderato.db`, the pepper, the signing key, the journal)
    /// land there, and waits until it listens. `env` must ask for JSON logs.
    pub fn start_in(dir: &Path, env: &[(String, String)]) -> ChildServer {
        let mut command = Command::new(env!("CARGO_BIN_EXE_moderato"));
        command.current_dir(dir);
        ChildServer::spawn(command, env)
    }

    fn spawn(mut command: Command, env: &[(String, String)]) -> ChildServer {
        let mut process = command
            .arg("serve")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn moderato");
        let mut lines = BufReader::new(process.stderr.take().expect("stderr")).lines();
        let address = loop {
            let line = lines
                .next()
                .expect("server exited before listening")
                .expect("log line");
            if let Ok(record) = serde_json::from_str::<Value>(&line) {
                if record["message"] == "moderato listening" {
                    break record["address"].as_str().expect("address").to_string();
                }
            }
        };
        let log = std::thread::spawn(move || lines.map_while(Result::ok).collect());
        ChildServer {
            process,
            address,
            log: Some(log),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// SIGKILL: no shutdown, no flush, nothing.
    pub fn kill_hard(&mut self) -> Vec<String> {
        self.process.kill().expect("kill -9");
        self.process.wait().expect("wait");
        self.log
            .take()
            .map(|l| l.join().unwrap_or_default())
            .unwrap_or_default()
    }

    /// A `/proc/<pid>/status` field in kB (VmHWM, VmRSS).
    pub fn status_kb(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.id()))
            .expect("/proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc status"))
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}
