//! An analyst's own table through the page, in headless Chromium against the real daemon: a
//! `;`-separated CSV and a `,`-separated hierarchy named unlike its column are uploaded; the proposed
//! roles are applied (the unique id dropped); the hierarchy is assigned by choice; settings the page
//! can judge before Run are flagged beside their control with a fix that works; a sweep that can
//! release nothing says why at the top of its results; a bucketization release shows and downloads
//! its sensitive table; the checks read as findings; the project is saved as a job file that
//! `cloakd table frontier` runs without flags and that restores the roles and settings after a
//! reload; at 1000 px wide the chart keeps most of the width and the release list does not scroll
//! sideways. A binary file is refused in plain words. Screenshots go where the main path's do.
use std::time::Duration;

use cloakd::config::Config;
use serde_json::Value;

use super::browser::{Browser, open, page_points, run_sweep, wait_columns, wait_ready};

/// A 200-row table of the analyst's own: `id` unique, `age` numeric, `zip` codes, `sex`, `disease`;
/// `;`-separated.
fn own_csv() -> String {
    let diseases = ["flu", "cold", "cough", "asthma"];
    let mut csv = String::from("id;age;zip;sex;disease\n");
    for i in 0..200u32 {
        csv.push_str(&format!(
            "p{i:04};{};{};{};{}\n",
            20 + i % 50,
            13050 + i % 7,
            if i % 2 == 0 { "Male" } else { "Female" },
            diseases[(i as usize * 7 + i as usize / 3) % diseases.len()]
        ));
    }
    csv
}

async fn text(browser: &Browser, script: &str) -> String {
    browser
        .js(&format!("return {script};"))
        .await
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The index of column `name` in the page's roles table.
async fn column_index(browser: &Browser, name: &str) -> usize {
    let v = browser
        .js(&format!(
            "return [...document.querySelectorAll('#columns tbody tr')].findIndex(r => r.dataset.column === {name:?});"
        ))
        .await;
    usize::try_from(v.as_i64().unwrap()).unwrap_or_else(|_| panic!("no column {name}"))
}

async fn upload(browser: &Browser, dir: &std::path::Path, csv: &str, hierarchies: &[&str]) {
    browser
        .find("#upload-csv")
        .await
        .send_keys(&dir.join(csv).display().to_string())
        .await
        .unwrap();
    for h in hierarchies {
        browser
            .find("#upload-hierarchies")
            .await
            .send_keys(&dir.join(h).display().to_string())
            .await
            .unwrap();
    }
    browser.click("#upload-submit").await;
}

/// Waits for a sweep to end (whatever its state) and returns the state.
async fn sweep_ended(browser: &Browser) -> String {
    browser
        .wait_until(
            "['done', 'cancelled', 'failed'].includes(document.body.dataset.sweep)",
            600,
        )
        .await;
    text(browser, "document.body.dataset.sweep").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_analysts_own_table_from_upload_to_findings_and_back_after_a_reload() {
    let Some((workbench, browser)) = open(
        "an_analysts_own_table_from_upload_to_findings_and_back_after_a_reload",
        Config::embedded_defaults(),
    )
    .await
    else {
        return;
    };
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("patients.csv"), own_csv()).unwrap();
    std::fs::write(
        files.path().join("sex-levels.csv"),
        "Male,person,*\nFemale,person,*\n",
    )
    .unwrap();
    std::fs::write(
        files.path().join("photo.csv"),
        [&b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"[..], &[0xff; 64]].concat(),
    )
    .unwrap();
    wait_ready(&browser).await;

    // A binary file is refused in words, naming what a table must be.
    upload(&browser, files.path(), "photo.csv", &[]).await;
    browser
        .wait_until("!document.getElementById('load-error').hidden", 30)
        .await;
    let error = text(
        &browser,
        "document.getElementById('load-error').textContent",
    )
    .await;
    assert!(error.contains("not a text table"), "{error}");

    // A delimiter chosen wrong: one column found, said in words with what to change.
    browser.select("#upload-delimiter", ",").await;
    upload(&browser, files.path(), "patients.csv", &[]).await;
    browser
        .wait_until(
            "document.getElementById('load-error').textContent.includes('one column found')",
            30,
        )
        .await;
    browser.select("#upload-delimiter", "").await;

    // The own table: `;` detected, the proposed roles applied, the unique id dropped.
    browser
        .js("document.getElementById('upload-hierarchies').value = ''; return 0;")
        .await;
    upload(&browser, files.path(), "patients.csv", &["sex-levels.csv"]).await;
    wait_columns(&browser).await;
    let columns = browser
        .js("return [...document.querySelectorAll('#columns tbody tr')].map(r => r.dataset.column);")
        .await;
    assert_eq!(
        columns,
        serde_json::json!(["id", "age", "zip", "sex", "disease"])
    );
    let (id, age, zip, sex, disease) = (
        column_index(&browser, "id").await,
        column_index(&browser, "age").await,
        column_index(&browser, "zip").await,
        column_index(&browser, "sex").await,
        column_index(&browser, "disease").await,
    );
    assert_eq!(
        text(
            &browser,
            &format!("document.getElementById('role-{id}').value")
        )
        .await,
        "drop"
    );
    assert_eq!(
        text(
            &browser,
            &format!("document.getElementById('role-{age}').value")
        )
        .await,
        "quasi"
    );
    let sensitive = browser
        .js("return [...document.querySelectorAll('#columns select[id^=role-]')].filter(s => s.value === 'sensitive').length;")
        .await;
    assert_eq!(sensitive, 1, "exactly one proposed sensitive column");

    // The hierarchy is assigned by choice, whatever its file is called.
    browser.select(&format!("#role-{sex}"), "quasi").await;
    browser
        .select(&format!("#hierarchy-{sex}"), "hierarchies/sex-levels.csv")
        .await;
    browser.select(&format!("#role-{zip}"), "insensitive").await;
    browser
        .select(&format!("#role-{disease}"), "sensitive")
        .await;
    browser.screenshot("own-1-table", Some("#step-load")).await;

    // Flags before Run: OLA without a hierarchy for age, k above the rows (fixed by its button), a
    // dropped attribute to learn (blocking Run until fixed).
    browser.fill("#sweep-k", "5,100000").await;
    browser.fill("#sweep-l", "2").await;
    browser.fill("#sweep-t", "").await;
    browser.fill("#sweep-delta", "").await;
    browser.click("#algorithm-ola").await;
    browser
        .wait_until(
            "document.querySelector('#sweep-flags li[data-flag=\"hierarchy-age\"]')",
            10,
        )
        .await;
    assert_eq!(
        text(
            &browser,
            &format!("document.getElementById('hierarchy-{age}').dataset.flagged")
        )
        .await,
        "warning"
    );
    browser
        .wait_until(
            "document.querySelector('#sweep-flags li[data-flag=\"k-above-rows\"]')",
            10,
        )
        .await;
    browser.select("#workload-attribute", "id").await;
    browser
        .wait_until(
            "document.querySelector('#sweep-flags li[data-flag=\"workload-dropped\"]')",
            10,
        )
        .await;
    assert_eq!(
        browser
            .js("return document.getElementById('run').disabled;")
            .await,
        true
    );
    browser.screenshot("own-2-flags", Some("#step-sweep")).await;
    browser
        .click("#sweep-flags button[data-fix=\"k-above-rows\"]")
        .await;
    assert_eq!(
        text(&browser, "document.getElementById('sweep-k').value").await,
        "5"
    );
    browser.select("#workload-attribute", "").await;
    browser.click("#algorithm-ola").await;
    browser
        .wait_until("document.getElementById('sweep-flags').hidden", 10)
        .await;
    assert_eq!(
        browser
            .js("return document.getElementById('run').disabled;")
            .await,
        false
    );

    // The hierarchy builder: intervals for age, previewed, downloaded and used; OLA's flag goes.
    browser.click("#algorithm-ola").await;
    browser
        .wait_until(
            "document.querySelector('#sweep-flags li[data-flag=\"hierarchy-age\"]')",
            10,
        )
        .await;
    browser.click(&format!("#build-{age}")).await;
    browser
        .wait_until(
            "document.querySelectorAll('#builder-table tbody tr').length > 0",
            30,
        )
        .await;
    assert_eq!(
        text(&browser, "document.getElementById('builder-mode').value").await,
        "intervals"
    );
    browser.fill("#builder-width", "10").await;
    browser.fill("#builder-fanout", "2").await;
    browser.fill("#builder-levels", "2").await;
    browser.click("#builder-preview").await;
    let first = browser
        .js("return [...document.querySelectorAll('#builder-table tbody tr:first-child td')].map(t => t.textContent);")
        .await;
    assert_eq!(
        first,
        serde_json::json!(["20", "[20, 30)", "[20, 40)", "*"])
    );
    browser.screenshot("own-2-builder", Some("#builder")).await;
    // Masking for codes (zip) and groups of values (sex), previewed line by line.
    browser.click("#builder-close").await;
    browser.click(&format!("#build-{zip}")).await;
    browser
        .wait_until(
            "document.getElementById('builder-title').textContent.endsWith('zip')",
            30,
        )
        .await;
    // zip's codes are numbers: the builder starts with intervals; masking is chosen.
    browser
        .wait_until(
            "document.querySelectorAll('#builder-table tbody tr').length > 0",
            30,
        )
        .await;
    browser.select("#builder-mode", "mask").await;
    browser.fill("#builder-mask-levels", "2").await;
    browser.click("#builder-preview").await;
    let masked = browser
        .js("return [...document.querySelectorAll('#builder-table tbody tr:first-child td')].map(t => t.textContent);")
        .await;
    assert_eq!(masked, serde_json::json!(["13050", "1305*", "130**", "*"]));
    browser.click("#builder-close").await;
    browser.click(&format!("#build-{sex}")).await;
    browser
        .wait_until(
            "document.getElementById('builder-title').textContent.endsWith('sex')",
            30,
        )
        .await;
    browser.fill("#builder-groups", "person: Male").await;
    browser.click("#builder-preview").await;
    let note = text(
        &browser,
        "document.getElementById('builder-note').textContent",
    )
    .await;
    assert!(note.contains("1 values are in no group"), "{note}");
    let grouped = browser
        .js("return [...document.querySelectorAll('#builder-table tbody tr')].map(r => [...r.children].map(t => t.textContent).join(';'));")
        .await;
    assert_eq!(
        grouped,
        serde_json::json!(["Male;person;*", "Female;other;*"])
    );
    browser.click("#builder-close").await;
    browser.click(&format!("#build-{age}")).await;
    browser
        .wait_until(
            "document.querySelectorAll('#builder-table tbody tr').length > 0",
            30,
        )
        .await;
    browser.fill("#builder-width", "10").await;
    browser.fill("#builder-fanout", "2").await;
    browser.fill("#builder-levels", "2").await;
    browser.click("#builder-preview").await;
    browser.click("#builder-download").await;
    let built = String::from_utf8(browser.downloaded("age.csv").await).unwrap();
    assert_eq!(built.lines().count(), 50, "one line per distinct age");
    assert_eq!(built.lines().next().unwrap(), "20;[20, 30);[20, 40);*");
    browser.click("#builder-use").await;
    browser
        .wait_until(
            &format!(
                "document.getElementById('hierarchy-{age}').value === 'hierarchies/age-built.csv'"
            ),
            30,
        )
        .await;
    browser
        .wait_until("document.getElementById('sweep-flags').hidden", 10)
        .await;
    browser.click("#algorithm-ola").await;

    // A sweep that releases: no outcome banner; listed among the page's sweeps.
    run_sweep(&browser).await;
    assert_eq!(sweep_ended(&browser).await, "done");
    let points = page_points(&browser).await;
    assert_eq!(
        points.len(),
        4,
        "k 5 and l 2, each by generalization and bucketization: {points:?}"
    );
    assert_eq!(
        browser
            .js("return document.getElementById('sweep-outcome').hidden;")
            .await,
        true
    );
    assert_eq!(
        browser
            .js("return document.querySelectorAll('#sweeps tbody tr').length;")
            .await,
        1
    );

    // A bucketization release: its sensitive table in the preview and as a download; the checks
    // as findings with a verdict each.
    let bucket = points
        .iter()
        .find(|p| p["method"] == "bucketization")
        .unwrap()
        .clone();
    let n = &bucket["release"];
    browser
        .click(&format!("#releases tr[data-release='{n}'] button"))
        .await;
    browser
        .wait_until(&format!("document.body.dataset.release === '{n}'"), 60)
        .await;
    browser
        .wait_until(
            "document.querySelectorAll('#sensitive-preview tbody tr').length > 0",
            30,
        )
        .await;
    let header = browser
        .js("return [...document.querySelectorAll('#sensitive-preview thead th')].map(t => t.textContent);")
        .await;
    assert_eq!(header[1], "disease", "{header}");
    let findings = browser
        .js("return [...document.querySelectorAll('#findings li')].map(l => [l.dataset.finding, l.dataset.verdict, l.textContent]);")
        .await;
    let findings = findings.as_array().unwrap();
    for id in ["homogeneity", "background", "unsorted", "risk"] {
        let f = findings
            .iter()
            .find(|f| f[0] == id)
            .unwrap_or_else(|| panic!("no {id} finding in {findings:?}"));
        assert!(
            ["ok", "warn", "bad"].contains(&f[1].as_str().unwrap()),
            "{f}"
        );
        assert!(f[2].as_str().unwrap().len() > 40, "a finding in words: {f}");
    }
    browser
        .screenshot("own-3-release", Some("#step-release"))
        .await;
    browser.click("#download-sensitive").await;
    let sensitive = browser.downloaded("sensitive.csv").await;
    assert!(
        String::from_utf8(sensitive)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .contains("disease"),
        "the sensitive table's header names the sensitive attribute"
    );

    // Two releases side by side: measures, class sizes and an attribute's distribution in the
    // input against each.
    let generalized: Vec<&str> = points
        .iter()
        .filter(|p| p["method"] == "generalization")
        .map(|p| p["release"].as_str())
        .collect();
    assert_eq!(generalized.len(), 2, "{points:?}");
    for n in &generalized {
        let css = format!("#releases input.compare[data-release='{n}']");
        browser
            .js(&format!(
                "document.querySelector({css:?}).scrollIntoView({{block: 'center'}}); return 0;"
            ))
            .await;
        browser.click(&css).await;
    }
    browser
        .wait_until("!document.getElementById('step-compare').hidden", 30)
        .await;
    // The step shows before both releases are read; its attributes are listed once they are.
    browser
        .wait_until(
            "document.querySelector(\"#compare-attribute option[value='age']\")",
            60,
        )
        .await;
    browser.select("#compare-attribute", "age").await;
    browser
        .wait_until(
            &format!(
                "document.body.dataset.compared === '{},{}:age'",
                generalized[0], generalized[1]
            ),
            60,
        )
        .await;
    let rows = browser
        .js("return [...document.querySelectorAll('#compare-measures tbody tr')].map(r => [r.dataset.row, r.children[1].textContent, r.children[2].textContent]);")
        .await;
    let ploss = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "Ploss")
        .unwrap_or_else(|| panic!("no Ploss row in {rows}"));
    let page_ploss = |n: &str| {
        points
            .iter()
            .find(|p| p["release"] == n)
            .map(|p| p["ploss"].parse::<f64>().unwrap())
            .unwrap()
    };
    assert!(
        (ploss[1].as_str().unwrap().parse::<f64>().unwrap() - page_ploss(generalized[0])).abs()
            < 1e-4,
        "{rows}"
    );
    assert!(
        (ploss[2].as_str().unwrap().parse::<f64>().unwrap() - page_ploss(generalized[1])).abs()
            < 1e-4,
        "{rows}"
    );
    // The prosecutor risk of each side: 1 / the smallest class.
    let row = |name: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == name)
            .unwrap_or_else(|| panic!("no {name} row in {rows}"))
            .clone()
    };
    let (highest, smallest) = (row("prosecutor risk, highest"), row("smallest class"));
    for side in [1, 2] {
        let risk: f64 = highest[side].as_str().unwrap().parse().unwrap();
        let size: f64 = smallest[side].as_str().unwrap().parse().unwrap();
        assert!((risk - 1.0 / size).abs() < 1e-4, "{rows}");
    }
    browser
        .screenshot("own-4-compare", Some("#step-compare"))
        .await;

    // A sweep that cannot release says so at the top of its results, and why.
    browser.fill("#sweep-k", "500").await;
    browser.fill("#sweep-l", "").await;
    run_sweep(&browser).await;
    assert_eq!(sweep_ended(&browser).await, "done");
    assert!(page_points(&browser).await.is_empty());
    browser
        .wait_until("!document.getElementById('sweep-outcome').hidden", 10)
        .await;
    let outcome = text(
        &browser,
        "document.getElementById('sweep-outcome').textContent",
    )
    .await;
    assert!(outcome.starts_with("No release was produced"), "{outcome}");
    assert!(outcome.contains("Why:"), "{outcome}");
    assert!(!outcome.contains("[object Object]"), "{outcome}");
    assert_eq!(
        text(&browser, "document.getElementById('status').textContent").await,
        outcome
    );
    assert_eq!(
        browser
            .js("return document.querySelectorAll('#sweeps tbody tr').length;")
            .await,
        2
    );

    // At 1000 px: the chart keeps most of the width, the release list does not scroll sideways.
    browser.fill("#sweep-k", "5,10").await;
    run_sweep(&browser).await;
    assert_eq!(sweep_ended(&browser).await, "done");
    browser.client.set_window_size(1000, 1000).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let chart = browser
        .js("return document.getElementById('frontier-chart').getBoundingClientRect().width;")
        .await;
    assert!(
        chart.as_f64().unwrap() >= 600.0,
        "frontier chart {chart} px wide at 1000 px"
    );
    let sideways = browser
        .js("const b = document.querySelector('.list-box'); return b.scrollWidth - b.clientWidth;")
        .await;
    assert!(
        sideways.as_f64().unwrap() <= 1.0,
        "the release list scrolls sideways by {sideways} px"
    );
    browser.screenshot("own-5-frontier-1000px", None).await;
    browser.client.set_window_size(1600, 1800).await.unwrap();

    // Save the project; `cloakd table frontier` runs it without flags (its [sweep]) ...
    browser.click("#export-job").await;
    let job = browser.downloaded("job.toml").await;
    let job_text = String::from_utf8(job.clone()).unwrap();
    assert!(job_text.contains("[sweep]"), "{job_text}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("job.toml"), &job).unwrap();
    std::fs::write(dir.path().join("patients.csv"), own_csv()).unwrap();
    std::fs::create_dir(dir.path().join("hierarchies")).unwrap();
    std::fs::write(
        dir.path().join("hierarchies/sex-levels.csv"),
        "Male,person,*\nFemale,person,*\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("hierarchies/age-built.csv"), &built).unwrap();
    let out = crate::support::bin()
        .args(["table", "frontier"])
        .arg(dir.path().join("job.toml"))
        .arg("--out")
        .arg(dir.path().join("frontier"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli_points = csv::Reader::from_path(dir.path().join("frontier/frontier.csv"))
        .unwrap()
        .records()
        .count();
    assert_eq!(cli_points, page_points(&browser).await.len());

    // ... and, after a reload and the same upload, restores the roles and the sweep settings.
    browser.client.refresh().await.unwrap();
    wait_ready(&browser).await;
    upload(&browser, files.path(), "patients.csv", &["sex-levels.csv"]).await;
    wait_columns(&browser).await;
    browser
        .find("#restore-job")
        .await
        .send_keys(&dir.path().join("job.toml").display().to_string())
        .await
        .unwrap();
    browser.click("#restore-submit").await;
    browser
        .wait_until("document.body.dataset.restored === 'job.toml'", 20)
        .await;
    let sex = column_index(&browser, "sex").await;
    assert_eq!(
        text(
            &browser,
            &format!("document.getElementById('role-{sex}').value")
        )
        .await,
        "quasi"
    );
    assert_eq!(
        text(
            &browser,
            &format!("document.getElementById('hierarchy-{sex}').value")
        )
        .await,
        "hierarchies/sex-levels.csv"
    );
    assert_eq!(
        text(&browser, "document.getElementById('sweep-k').value").await,
        "5,10"
    );
    let restored: Value = browser
        .js("return document.getElementById('sweep-l').value;")
        .await;
    assert_eq!(restored, "");
    // The built hierarchy belonged to the table before the reload: the page says it is missing.
    let missing = text(
        &browser,
        "document.getElementById('restore-error').textContent",
    )
    .await;
    assert!(missing.contains("hierarchies/age-built.csv"), "{missing}");

    browser.close().await;
    workbench.shutdown().await;
}
