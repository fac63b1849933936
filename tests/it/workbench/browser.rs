//! The analyst's workbench in a real browser: Debian's headless Chromium driven through WebDriver
//! (chromedriver on a free loopback port, the `fantoccini` crate) against the real daemon
//! (`daemon::serve` on 127.0.0.1:0 with the workbench listener on 127.0.0.1:0).
//!
//! The main path: load the Adult example, assign roles, run a small sweep, read the frontier's points
//! from the page's release list and compare them with `cloakd table frontier` (the real binary) run
//! on the job the page exports with the command the page shows; open one release, download its CSV
//! through the page (Chromium's download directory), check it with the independent relational
//! checker (`tests/it/support/relational_checker.rs`) and against `cloakd table anonymize` on the
//! release's job.toml downloaded from the page. With `auth.required`: no token → the token prompt
//! and the API refuses, a consumer's token → refused in the page, an analyst's token → works. Keyboard only:
//! the main path with Tab/Enter/Space presses, visible focus, and an accessible label on every
//! control. The table's re-identification risk shown after load equals `cloakd table risk`'s, and a
//! release's record-risk histogram and riskiest classes equal the classes of its downloaded CSV.
//! Screenshots of each step go to `target/workbench-screenshots/`.
//!
//! Without `/usr/bin/chromium` and `/usr/bin/chromedriver` (Debian's `chromium`, `chromium-driver`;
//! `CLOAKD_CHROMIUM` / `CLOAKD_CHROMEDRIVER` override the paths) each test prints a SKIP line and
//! returns.
use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cloakd::config::Config;
use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::support::relational_checker::check_generalized_csv;
use crate::support::repo;
use crate::support::workbench::{Workbench, adult_original, spec_of};

// ------------------------------------------------------------------------------------------------
// Chromium through chromedriver
// ------------------------------------------------------------------------------------------------

fn tool(env: &str, default: &str) -> Option<PathBuf> {
    let path = std::env::var_os(env).map_or_else(|| PathBuf::from(default), PathBuf::from);
    path.is_file().then_some(path)
}

/// Chromium and chromedriver, or a SKIP line naming what is missing.
pub(super) fn browser_tools(test: &str) -> Option<(PathBuf, PathBuf)> {
    match (
        tool("CLOAKD_CHROMIUM", "/usr/bin/chromium"),
        tool("CLOAKD_CHROMEDRIVER", "/usr/bin/chromedriver"),
    ) {
        (Some(chromium), Some(driver)) => Some((chromium, driver)),
        _ => {
            println!(
                "SKIP {test}: needs Chromium and chromedriver (Debian: apt-get install -y chromium chromium-driver; \
                 or set CLOAKD_CHROMIUM and CLOAKD_CHROMEDRIVER)"
            );
            None
        }
    }
}

/// A headless Chromium session with its own profile and download directory.
pub(super) struct Browser {
    pub(super) client: Client,
    driver: Child,
    downloads: tempfile::TempDir,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub(super) async fn start((chromium, chromedriver): &(PathBuf, PathBuf)) -> Browser {
        let port = crate::support::free_port();
        // In a process group of its own, with the Chromium it starts: a failing test ends both.
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        let profile = tempfile::tempdir().unwrap();
        let downloads = tempfile::tempdir().unwrap();
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--disable-dev-shm-usage",
                    "--window-size=1600,1800",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
                "prefs": {
                    "download.default_directory": downloads.path(),
                    "download.prompt_for_download": false,
                    "download.directory_upgrade": true,
                    "safebrowsing.enabled": false,
                },
            },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(e) if started.elapsed() < Duration::from_secs(30) => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("chromedriver on port {port} gave no session in 30 s: {e}"),
            }
        };
        Browser {
            client,
            driver,
            downloads,
            _profile: profile,
        }
    }

    /// Closes the session (Chromium quits); dropping ends chromedriver.
    pub(super) async fn close(self) {
        let _ = self.client.clone().close().await;
    }

    pub(super) async fn js(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("script {script:?}: {e}"))
    }

    /// Waits (up to `secs`) until `condition` (a JS expression) is truthy.
    pub(super) async fn wait_until(&self, condition: &str, secs: u64) {
        let started = Instant::now();
        let script = format!("return Boolean({condition});");
        loop {
            if self.js(&script).await == Value::Bool(true) {
                return;
            }
            if started.elapsed() > Duration::from_secs(secs) {
                let status = self
                    .js("return document.getElementById('status').textContent + ' | ' + [...document.querySelectorAll('.error')].map(e => e.textContent).join(' | ');")
                    .await;
                panic!("waited {secs} s for {condition}; the page says: {status}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(super) async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(20))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("element {css}: {e}"))
    }

    pub(super) async fn click(&self, css: &str) {
        self.find(css).await.click().await.unwrap();
    }

    /// Types `text` into the field, once the page lets it be typed into: a field found while the
    /// page is still showing it (or re-rendering it) is "not interactable" for a moment, which a
    /// loaded machine made long enough to fail a test.
    pub(super) async fn fill(&self, css: &str, text: &str) {
        use fantoccini::error::{CmdError, ErrorStatus};
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let e = self.find(css).await;
            let typed = match e.clear().await {
                Ok(()) => e.send_keys(text).await,
                Err(err) => Err(err),
            };
            match typed {
                Ok(()) => return,
                Err(CmdError::Standard(w))
                    if matches!(
                        w.error,
                        ErrorStatus::ElementNotInteractable | ErrorStatus::StaleElementReference
                    ) && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err) => panic!("typing into {css}: {err}"),
            }
        }
    }

    pub(super) async fn select(&self, css: &str, value: &str) {
        self.find(css).await.select_by_value(value).await.unwrap();
    }

    /// A screenshot of the whole window (`section`: of that element) under
    /// target/workbench-screenshots/NAME.png.
    pub(super) async fn screenshot(&self, name: &str, section: Option<&str>) -> PathBuf {
        let png = match section {
            Some(css) => {
                self.js(&format!(
                    "document.querySelector({css:?}).scrollIntoView({{block: 'start'}}); return 0;"
                ))
                .await;
                self.find(css).await.screenshot().await.unwrap()
            }
            None => self.client.screenshot().await.unwrap(),
        };
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// Waits for `name` to be complete in the download directory and returns its bytes.
    pub(super) async fn downloaded(&self, name: &str) -> Vec<u8> {
        let path = self.downloads.path().join(name);
        let partial = self.downloads.path().join(format!("{name}.crdownload"));
        let started = Instant::now();
        while !path.is_file() || partial.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{name} was not downloaded within 60 s (directory holds {:?})",
                std::fs::read_dir(self.downloads.path())
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        bytes
    }

    /// Key presses through WebDriver's actions (to whatever has the focus, as a keyboard does):
    /// each of `held` down, every key of `keys` pressed and released in turn, `held` released.
    pub(super) async fn keys(&self, held: &[char], keys: &[char]) {
        let mut actions = KeyActions::new("keyboard".to_string());
        for &h in held {
            actions = actions.then(KeyAction::Down { value: h });
        }
        for &k in keys {
            actions = actions
                .then(KeyAction::Down { value: k })
                .then(KeyAction::Up { value: k });
        }
        for &h in held.iter().rev() {
            actions = actions.then(KeyAction::Up { value: h });
        }
        self.client.perform_actions(actions).await.unwrap();
        self.client.release_actions().await.unwrap();
    }

    /// Presses `key` (Tab, Enter, Backspace, ...).
    pub(super) async fn press(&self, key: Key) {
        self.keys(&[], &[char::from(key)]).await;
    }

    /// Presses the key of `c` (Space on a button or checkbox).
    pub(super) async fn press_char(&self, c: char) {
        self.keys(&[], &[c]).await;
    }

    /// Types `text` key by key.
    pub(super) async fn type_text(&self, text: &str) {
        self.keys(&[], &text.chars().collect::<Vec<_>>()).await;
    }

    /// Presses Tab until the element with `id` has the focus (at most 400 presses), checking on the
    /// way that each focused control shows a focus outline.
    pub(super) async fn tab_to(&self, id: &str) {
        for _ in 0..400 {
            let focused = self
                .js(
                    "const e = document.activeElement; const s = getComputedStyle(e); \
                     return [e.id, e.tagName, s.outlineStyle, s.outlineWidth];",
                )
                .await;
            if focused[0] == id {
                return;
            }
            let tag = focused[1].as_str().unwrap_or("");
            if ["BUTTON", "INPUT", "SELECT"].contains(&tag) {
                assert!(
                    focused[2] != "none" && focused[3] != "0px",
                    "focused {focused:?} shows no focus outline"
                );
            }
            self.press(Key::Tab).await;
        }
        panic!("{id} is not reachable with Tab");
    }
}

impl Drop for Browser {
    /// Ends chromedriver's process group (chromedriver and the Chromium it started), also when a
    /// failing test never closed the session.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.driver.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("workbench-screenshots")
}

// ------------------------------------------------------------------------------------------------
// Reading the page
// ------------------------------------------------------------------------------------------------

/// The frontier's points as the page lists them (the release list's `data-` attributes).
pub(super) async fn page_points(browser: &Browser) -> Vec<HashMap<String, String>> {
    let rows = browser
        .js("return [...document.querySelectorAll('#releases tbody tr')].map(r => Object.assign({}, r.dataset));")
        .await;
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect()
        })
        .collect()
}

/// Controls without an accessible name (label, aria-label, or a button's text).
async fn unlabelled(browser: &Browser) -> Value {
    browser
        .js("return [...document.querySelectorAll('input, select, textarea, button')].filter(e => { \
               const labels = e.labels ? [...e.labels].map(l => l.textContent.trim()).join(' ') : ''; \
               const aria = (e.getAttribute('aria-label') || '').trim(); \
               const text = e.tagName === 'BUTTON' ? e.textContent.trim() : ''; \
               return !(labels || aria || text); \
             }).map(e => e.id || e.outerHTML.slice(0, 80));")
        .await
}

async fn mark(browser: &Browser, name: &str) -> Option<f64> {
    browser
        .js(&format!(
            "const m = performance.getEntriesByName({name:?}); return m.length ? m[m.length - 1].startTime : null;"
        ))
        .await
        .as_f64()
}

// ------------------------------------------------------------------------------------------------
// The CLI and the checker
// ------------------------------------------------------------------------------------------------

/// `frontier.csv` of `cloakd table frontier` run with the page's command on the page's exported job.
fn cli_frontier(command: &str, job: &[u8]) -> Vec<HashMap<String, String>> {
    let (dir, job_path) = job_dir(job);
    let out = dir.path().join("frontier");
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(&words[..3], ["cloakd", "table", "frontier"], "{command}");
    let mut args: Vec<String> = vec!["table".into(), "frontier".into()];
    let mut rest = words[3..].iter();
    while let Some(w) = rest.next() {
        match *w {
            "job.toml" => args.push(job_path.display().to_string()),
            "--out" => {
                rest.next();
                args.push("--out".into());
                args.push(out.display().to_string());
            }
            other => args.push(other.to_string()),
        }
    }
    let output = crate::support::bin().args(&args).output().unwrap();
    assert!(
        output.status.success(),
        "cloakd {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut reader = csv::Reader::from_path(out.join("frontier.csv")).unwrap();
    let header: Vec<String> = reader.headers().unwrap().iter().map(String::from).collect();
    reader
        .records()
        .map(|r| {
            header
                .iter()
                .cloned()
                .zip(r.unwrap().iter().map(String::from))
                .collect()
        })
        .collect()
}

/// A directory where a job exported by the page runs: it names the table's files as
/// examples/adult.toml does (`data/...`), so it runs beside a link to examples/data.
fn job_dir(job: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo().join("examples/data"), dir.path().join("data")).unwrap();
    let job_path = dir.path().join("job.toml");
    std::fs::write(&job_path, job).unwrap();
    (dir, job_path)
}

/// The release `cloakd table anonymize` writes for `job`.
fn cli_anonymize(job: &[u8]) -> Vec<u8> {
    let (dir, job_path) = job_dir(job);
    let out = dir.path().join("release.csv");
    let output = crate::support::bin()
        .args(["table", "anonymize"])
        .arg(&job_path)
        .arg("--output")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cloakd table anonymize: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::read(out).unwrap()
}

// ------------------------------------------------------------------------------------------------
// The tests
// ------------------------------------------------------------------------------------------------

/// The daemon (with `config`) and a browser on its workbench page, or `None` (after a SKIP line)
/// without Chromium.
pub(super) async fn open(test: &str, config: Config) -> Option<(Workbench, Browser)> {
    let tools = browser_tools(test)?;
    let workbench = Workbench::start(config).await;
    let browser = Browser::start(&tools).await;
    browser.client.goto(&workbench.url()).await.unwrap();
    Some((workbench, browser))
}

/// Waits for the page's first step (session and examples loaded).
pub(super) async fn wait_ready(browser: &Browser) {
    browser
        .wait_until("document.body.dataset.ready === '1'", 30)
        .await;
}

/// Waits for the loaded table's columns.
pub(super) async fn wait_columns(browser: &Browser) {
    browser
        .wait_until(
            "document.querySelectorAll('#columns tbody tr').length > 0",
            60,
        )
        .await;
}

/// Waits for the sweep to end and asserts it is done.
/// Clicks Run for a new sweep. The page keeps the previous sweep's state in `data-sweep` until the
/// new sweep's POST has returned, so a wait for a finished sweep right after the click could see
/// the previous one (and then read "running"): the marker is forgotten first.
pub(super) async fn run_sweep(browser: &Browser) {
    browser
        .js("delete document.body.dataset.sweep; return null;")
        .await;
    browser.click("#run").await;
}

pub(super) async fn wait_sweep_done(browser: &Browser) {
    browser
        .wait_until(
            "['done', 'cancelled', 'failed'].includes(document.body.dataset.sweep)",
            900,
        )
        .await;
    assert_eq!(
        browser.js("return document.body.dataset.sweep;").await,
        "done"
    );
}

/// Which columns of the Adult example take which role (examples/adult.toml).
const ADULT_ROLES: [(&str, &str, &str); 7] = [
    ("age", "quasi", ""),
    ("workclass", "quasi", "workclass.csv"),
    ("education", "quasi", "education.csv"),
    ("marital-status", "quasi", "marital-status.csv"),
    ("race", "quasi", "race.csv"),
    ("sex", "quasi", "sex.csv"),
    ("occupation", "sensitive", ""),
];

/// Sets every column's role in the page: the Adult roles above, every other column dropped.
async fn assign_adult_roles(browser: &Browser) {
    let columns = browser
        .js("return [...document.querySelectorAll('#columns tbody tr')].map(r => r.dataset.column);")
        .await;
    for (i, name) in columns.as_array().unwrap().iter().enumerate() {
        let name = name.as_str().unwrap();
        let (role, hierarchy) = ADULT_ROLES
            .iter()
            .find(|(n, _, _)| *n == name)
            .map_or(("drop", ""), |(_, r, h)| (*r, *h));
        browser.select(&format!("#role-{i}"), role).await;
        if !hierarchy.is_empty() {
            let value = browser
                .js(&format!(
                    "return [...document.querySelectorAll('#hierarchy-{i} option')].map(o => o.value).find(v => v.endsWith('/{hierarchy}')) || null;"
                ))
                .await;
            let value = value
                .as_str()
                .unwrap_or_else(|| panic!("no hierarchy {hierarchy} offered for {name}"));
            browser.select(&format!("#hierarchy-{i}"), value).await;
        } else if role == "quasi" {
            browser.select(&format!("#hierarchy-{i}"), "").await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adult_sweep_matches_the_cli_and_the_download_passes_the_checker() {
    let Some((workbench, browser)) = open(
        "adult_sweep_matches_the_cli_and_the_download_passes_the_checker",
        Config::embedded_defaults(),
    )
    .await
    else {
        return;
    };
    wait_ready(&browser).await;
    let interactive = mark(&browser, "wb-interactive").await.unwrap();
    println!("time to interactive: {interactive:.0} ms after navigation start");
    browser.screenshot("1-start", None).await;

    // Step 1: the Adult example and its roles.
    browser.click("#example-adult").await;
    wait_columns(&browser).await;
    assign_adult_roles(&browser).await;
    browser.screenshot("2-table", Some("#step-load")).await;

    // Step 2: a small sweep (4 parameters x 2 methods, Mondrian).
    browser.fill("#sweep-k", "10,100").await;
    browser.fill("#sweep-l", "3").await;
    browser.fill("#sweep-t", "0.2").await;
    browser.fill("#sweep-delta", "").await;
    run_sweep(&browser).await;
    wait_sweep_done(&browser).await;
    browser.screenshot("3-sweep", Some("#step-sweep")).await;
    browser
        .screenshot("4-frontier", Some("#step-frontier"))
        .await;

    // The page's points against `cloakd table frontier` for the same job and sweep.
    let points = page_points(&browser).await;
    assert_eq!(points.len(), 8, "{points:?}");
    browser.click("#reproduce summary").await;
    let command = browser
        .js("return document.getElementById('cli-command').textContent;")
        .await;
    browser.click("#export-job").await;
    let job = browser.downloaded("job.toml").await;
    let cli = cli_frontier(command.as_str().unwrap(), &job);
    assert_eq!(cli.len(), points.len(), "CLI {cli:?}\npage {points:?}");
    for row in &cli {
        let parameter: f64 = row["parameter"].parse().unwrap();
        let point = points
            .iter()
            .find(|p| {
                p["model"] == row["model"]
                    && p["method"] == row["method"]
                    && p["algorithm"] == row["algorithm"]
                    && p["parameter"].parse::<f64>().unwrap() == parameter
            })
            .unwrap_or_else(|| panic!("the page lacks the CLI's point {row:?}"));
        for (csv, data) in [
            ("ploss", "ploss"),
            ("uloss", "uloss"),
            ("a_know", "aKnow"),
            ("a_acc", "aAcc"),
        ] {
            let cli_value: f64 = row[csv].parse().unwrap();
            let page_value: f64 = point[data].parse().unwrap();
            assert!(
                (cli_value - page_value).abs() <= 5e-7,
                "{csv} of {row:?}: CLI {cli_value}, page {page_value}"
            );
        }
        assert_eq!(row["efficient"], point["efficient"], "{row:?} vs {point:?}");
    }

    // Step 4: the generalized release with the largest k, opened and downloaded through the page.
    let chosen = points
        .iter()
        .filter(|p| p["method"] == "generalization" && p["model"] == "k-anonymity")
        .max_by(|a, b| {
            a["parameter"]
                .parse::<f64>()
                .unwrap()
                .total_cmp(&b["parameter"].parse().unwrap())
        })
        .unwrap()
        .clone();
    let n = &chosen["release"];
    browser
        .click(&format!("#releases tr[data-release='{n}'] button"))
        .await;
    browser
        .wait_until(&format!("document.body.dataset.release === '{n}'"), 60)
        .await;
    browser
        .wait_until(
            "document.querySelectorAll('#preview tbody tr').length > 0",
            30,
        )
        .await;
    browser.screenshot("5-release", Some("#step-release")).await;
    let labels = unlabelled(&browser).await;
    assert_eq!(labels, json!([]), "controls without an accessible name");
    browser.click("#download-csv").await;
    let csv = browser.downloaded("release.csv").await;
    let spec = spec_of(&chosen["model"], chosen["parameter"].parse().unwrap());
    check_generalized_csv(&adult_original(), &spec, &csv, true);
    browser.click("#download-report").await;
    let report: Value = serde_json::from_slice(&browser.downloaded("report.json").await).unwrap();
    assert_eq!(report["rows"], 45_222);
    // The release's job, downloaded through the page, run by `cloakd table anonymize`: the same
    // bytes as the page's download.
    browser.click("#download-job").await;
    let release_job = browser.downloaded("job.toml").await;
    assert_eq!(
        cli_anonymize(&release_job),
        csv,
        "cloakd table anonymize on the page's job.toml"
    );

    browser.close().await;
    workbench.shutdown().await;
}

/// A figure of the page's table-risk list (its `data-value`).
async fn table_risk_figure(browser: &Browser, key: &str) -> f64 {
    browser
        .js(&format!(
            "return document.querySelector('#table-risk-figures tr[data-key=\"{key}\"]').dataset.value;"
        ))
        .await
        .as_str()
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e}"))
}

/// A comma-separated list of counts the page keeps on an element's `data-` attribute.
async fn counts(browser: &Browser, css: &str, attribute: &str) -> Vec<u64> {
    browser
        .js(&format!(
            "return document.querySelector({css:?}).dataset.{attribute};"
        ))
        .await
        .as_str()
        .unwrap()
        .split(',')
        .map(|c| c.parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_tables_risk_after_load_and_a_releases_risk_histogram() {
    let Some((workbench, browser)) = open(
        "the_page_shows_the_tables_risk_after_load_and_a_releases_risk_histogram",
        Config::embedded_defaults(),
    )
    .await
    else {
        return;
    };
    wait_ready(&browser).await;
    browser.click("#example-adult").await;
    wait_columns(&browser).await;

    // Step 1: the table's risk is measured on load, on the proposed roles (examples/adult.toml's
    // six quasi-identifiers), with SUDA up to size 2: the figures of `cloakd table risk`.
    browser
        .wait_until("document.body.dataset.tableRisk === 'measured'", 120)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("risk.json");
    let output = crate::support::bin()
        .args(["table", "risk"])
        .arg(repo().join("examples/adult.toml"))
        .args(["--suda-max-size", "2", "--report"])
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cloakd table risk: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let cli: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let cli = &cli["risk"];
    assert_eq!(table_risk_figure(&browser, "records").await, 45_222.0);
    for (key, figure) in [
        ("classes", &cli["classes"]),
        ("highest", &cli["prosecutor"]["highest"]),
        ("average", &cli["prosecutor"]["average"]),
        ("at-risk", &cli["prosecutor"]["records_at_risk"]),
        ("uniques", &cli["sample_uniqueness"]["unique_records"]),
        ("suda", &cli["suda"]["records_with_msu"]),
    ] {
        let page = table_risk_figure(&browser, key).await;
        let cli = figure.as_f64().unwrap();
        assert!(
            (page - cli).abs() <= 1e-12 * cli.abs().max(1.0),
            "{key}: page {page}, CLI {cli}"
        );
    }
    let bins = counts(&browser, "#table-risk-chart", "records").await;
    assert_eq!(bins.iter().sum::<u64>(), 45_222);
    assert_eq!(bins[0], cli["sample_uniqueness"]["unique_records"]);
    browser
        .screenshot("risk-1-table", Some("#table-risk"))
        .await;

    // Changing the quasi-identifiers marks the figures stale until they are measured again.
    let race = browser
        .js("return [...document.querySelectorAll('#columns tbody tr')].findIndex(r => r.dataset.column === 'race');")
        .await;
    browser
        .select(&format!("#role-{}", race.as_i64().unwrap()), "insensitive")
        .await;
    browser
        .wait_until("document.body.dataset.tableRisk === 'stale'", 10)
        .await;
    browser.click("#risk-measure").await;
    browser
        .wait_until("document.body.dataset.tableRisk === 'measured'", 120)
        .await;
    assert!(table_risk_figure(&browser, "classes").await <= cli["classes"].as_f64().unwrap());

    // Step 4: a release's record-risk histogram and riskiest classes equal the classes of its
    // released CSV, downloaded through the page.
    browser.fill("#sweep-k", "50").await;
    browser.fill("#sweep-l", "").await;
    browser.fill("#sweep-t", "").await;
    browser.fill("#sweep-delta", "").await;
    browser.click("#method-bucketization").await;
    run_sweep(&browser).await;
    wait_sweep_done(&browser).await;
    browser.click("#releases tr[data-release='0'] button").await;
    browser
        .wait_until("document.body.dataset.release === '0'", 60)
        .await;
    browser
        .wait_until("document.getElementById('risk-chart').dataset.records", 30)
        .await;
    browser.click("#download-csv").await;
    let csv = browser.downloaded("release.csv").await;
    let (header, rows) = crate::support::relational_checker::parse_csv(&csv);
    let quasi: Vec<usize> = ["age", "workclass", "education", "marital-status", "sex"]
        .iter()
        .map(|name| header.iter().position(|h| h == name).unwrap())
        .collect();
    let mut classes: HashMap<Vec<&str>, u64> = HashMap::new();
    for row in &rows {
        let key: Vec<&str> = quasi.iter().map(|&c| row[c].as_str()).collect();
        if !key.iter().all(|v| *v == "*") {
            *classes.entry(key.clone()).or_default() += 1;
        }
    }
    let sizes: Vec<u64> = classes.values().copied().collect();
    let bounds = [
        (1, 1),
        (2, 2),
        (3, 4),
        (5, 9),
        (10, 19),
        (20, 49),
        (50, 99),
        (100, u64::MAX),
    ];
    let inside = |lo: u64, hi: u64| sizes.iter().filter(move |&&s| lo <= s && s <= hi);
    let records: Vec<u64> = bounds
        .iter()
        .map(|&(lo, hi)| inside(lo, hi).sum())
        .collect();
    let class_counts: Vec<u64> = bounds
        .iter()
        .map(|&(lo, hi)| inside(lo, hi).count() as u64)
        .collect();
    assert_eq!(counts(&browser, "#risk-chart", "records").await, records);
    assert_eq!(
        counts(&browser, "#risk-chart", "classes").await,
        class_counts
    );
    let mut distinct = sizes.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let riskiest = browser
        .js("return [...document.querySelectorAll('#riskiest tbody tr')].map(r => [Number(r.dataset.size), Number(r.dataset.classes)]);")
        .await;
    let expected: Vec<(u64, u64)> = distinct
        .iter()
        .take(10)
        .map(|&size| (size, sizes.iter().filter(|&&s| s == size).count() as u64))
        .collect();
    assert_eq!(riskiest, json!(expected));
    // The riskiest classes are sizes and risks only: no released value of a quasi-identifier.
    let text = browser
        .js("return document.getElementById('riskiest').textContent;")
        .await;
    for key in classes.keys() {
        for value in key {
            if value.parse::<f64>().is_err() && *value != "*" {
                assert!(!text.as_str().unwrap().contains(value), "{value} in {text}");
            }
        }
    }
    browser
        .screenshot("risk-2-release", Some("#step-release"))
        .await;
    browser.close().await;
    workbench.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_the_page_asks_for_a_token_and_refuses_a_consumer() {
    let Some((workbench, browser)) = open(
        "with_auth_the_page_asks_for_a_token_and_refuses_a_consumer",
        crate::support::security::secured_config(),
    )
    .await
    else {
        return;
    };

    // No token: the page shows the token prompt, and the API refuses a call without one.
    browser
        .wait_until("document.body.dataset.auth === 'required'", 30)
        .await;
    assert!(browser.find("#token").await.is_displayed().await.unwrap());
    assert_eq!(
        browser
            .js("return document.getElementById('token').type;")
            .await,
        "password"
    );
    let refused = browser
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1]; \
             Promise.all(['/api/v1/session', '/api/v1/examples'].map(p => fetch(p).then(r => r.status))).then(done);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(refused[1], 401, "{refused:?}");
    browser.screenshot("6-token", None).await;

    // A consumer's token: refused in the page.
    browser
        .fill("#token", &crate::support::security::token_of("reader"))
        .await;
    browser.click("#token-submit").await;
    browser
        .wait_until("document.body.dataset.auth === 'forbidden'", 30)
        .await;
    let message = browser
        .js("return document.getElementById('auth-error').textContent;")
        .await;
    assert!(
        message
            .as_str()
            .unwrap()
            .contains("role may not use the workbench"),
        "{message}"
    );
    assert_eq!(
        browser
            .js("return document.getElementById('step-load').hidden;")
            .await,
        true
    );
    browser.screenshot("7-consumer-refused", None).await;

    // An analyst's token: the workbench works (the example loads with its columns).
    browser
        .fill("#token", &crate::support::security::token_of("analyst"))
        .await;
    browser.click("#token-submit").await;
    wait_ready(&browser).await;
    browser.click("#example-adult").await;
    wait_columns(&browser).await;
    let who = browser
        .js("return document.getElementById('who').textContent;")
        .await;
    assert!(who.as_str().unwrap().contains("analyst"), "{who}");
    // The token is in no cookie and no storage.
    assert_eq!(
        browser
            .js("return [document.cookie, localStorage.length, sessionStorage.length];")
            .await,
        json!(["", 0, 0])
    );
    browser.screenshot("8-analyst", None).await;

    browser.close().await;
    workbench.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_path_works_by_keyboard_alone() {
    let Some((workbench, browser)) = open(
        "the_main_path_works_by_keyboard_alone",
        Config::embedded_defaults(),
    )
    .await
    else {
        return;
    };
    wait_ready(&browser).await;

    // Load the example: Tab to its button, Enter.
    browser.tab_to("example-adult").await;
    browser.press(Key::Enter).await;
    wait_columns(&browser).await;
    // A role by keyboard: native-country (dropped, the last role) becomes insensitive with the
    // select's ArrowUp.
    let index = browser
        .js("return [...document.querySelectorAll('#columns tbody tr')].findIndex(r => r.dataset.column === 'native-country');")
        .await;
    let role = format!("role-{index}");
    assert_eq!(
        browser
            .js(&format!("return document.getElementById('{role}').value;"))
            .await,
        "drop"
    );
    browser.tab_to(&role).await;
    browser.press(Key::Up).await;
    assert_eq!(
        browser
            .js(&format!("return document.getElementById('{role}').value;"))
            .await,
        "insensitive"
    );
    // A two-release sweep: the k list typed into its field, the other models emptied.
    for (id, text) in [
        ("sweep-k", "10,50"),
        ("sweep-l", ""),
        ("sweep-t", ""),
        ("sweep-delta", ""),
    ] {
        browser.tab_to(id).await;
        browser.keys(&[char::from(Key::Control)], &['a']).await;
        browser.press(Key::Backspace).await;
        browser.type_text(text).await;
    }
    // Bucketization off: Space on its checkbox.
    browser.tab_to("method-bucketization").await;
    browser.press_char(' ').await;
    browser.tab_to("run").await;
    browser.press(Key::Enter).await;
    wait_sweep_done(&browser).await;
    let points = page_points(&browser).await;
    assert_eq!(points.len(), 2, "{points:?}");
    // Open the second release with Space on its list button (the keyboard's way to pick a point).
    let second = &points[1]["release"];
    let button = browser
        .js(&format!(
            "const b = document.querySelector(\"#releases tr[data-release='{second}'] button\"); b.id = 'pick-' + {second:?}; return b.id;"
        ))
        .await;
    browser.tab_to(button.as_str().unwrap()).await;
    browser.press_char(' ').await;
    browser
        .wait_until(&format!("document.body.dataset.release === '{second}'"), 60)
        .await;
    // Download the CSV with Enter.
    browser.tab_to("download-csv").await;
    browser.press(Key::Enter).await;
    let csv = browser.downloaded("release.csv").await;
    assert!(csv.starts_with(b"age,"), "{:?}", &csv[..csv.len().min(80)]);
    browser
        .screenshot("9-keyboard", Some("#step-release"))
        .await;
    let labels = unlabelled(&browser).await;
    assert_eq!(labels, json!([]), "controls without an accessible name");

    browser.close().await;
    workbench.shutdown().await;
}

/// The figures of docs/workbench.md: the page's time to interactive, and a 30-release sweep on the
/// whole Adult example (k's and l's 8 + 7 values of Li & Li's sets, both methods, Mondrian) from the
/// page's side: time to the first point and to the last, read from the page's performance marks.
/// A measurement, not a check (no thresholds): run it with
/// `cargo test --test it workbench::browser::thirty -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run by hand on a machine whose load you know"]
async fn thirty_release_sweep_timings() {
    let Some((workbench, browser)) =
        open("thirty_release_sweep_timings", Config::embedded_defaults()).await
    else {
        return;
    };
    for round in 0..3 {
        browser.client.goto(&workbench.url()).await.unwrap();
        wait_ready(&browser).await;
        let interactive = mark(&browser, "wb-interactive").await.unwrap();
        let dom = browser
            .js("const n = performance.getEntriesByType('navigation')[0]; return n.domContentLoadedEventEnd;")
            .await;
        println!("round {round}: interactive {interactive:.0} ms (DOMContentLoaded {dom} ms)");
    }
    browser.click("#example-adult").await;
    wait_columns(&browser).await;
    browser
        .fill("#sweep-k", "10,50,100,200,500,1000,2000,5000")
        .await;
    browser.fill("#sweep-l", "3,3.5,4,4.25,4.5,4.75,5").await;
    browser.fill("#sweep-t", "").await;
    browser.fill("#sweep-delta", "").await;
    run_sweep(&browser).await;
    browser
        .wait_until(
            "['done', 'cancelled', 'failed'].includes(document.body.dataset.sweep)",
            900,
        )
        .await;
    assert_eq!(page_points(&browser).await.len(), 30);
    let start = mark(&browser, "wb-sweep-start").await.unwrap();
    let first = mark(&browser, "wb-first-point").await.unwrap();
    let done = mark(&browser, "wb-sweep-done").await.unwrap();
    println!(
        "30-release sweep on Adult: first point {:.0} ms, finished {:.0} ms after Run",
        first - start,
        done - start
    );
    browser.close().await;
    workbench.shutdown().await;
}
