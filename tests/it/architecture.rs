//! The house rules of `docs/architecture.md` (sections 1 and 6), checked on the source itself: no
//! import cycle between the files of `src/` and `crates/engines/src/` (the engines' crate, whose
//! modules the daemon re-exports under the same names), every top-level module imports only what its
//! layer may ("What each layer may import"), the engines stay pure (their crate depends on nothing
//! with a runtime, a network or a clock, and their code opens no file and reads no clock), and no
//! file outgrows 1,000 lines of code.
//!
//! Also: every integration test is a module of the one test binary `tests/it/main.rs` (with
//! `autotests = false` cargo would silently ignore any other `tests/*.rs`), unless `Cargo.toml`
//! gives it a `[[test]]` target of its own.
//!
//! Imports are read from the text: every `crate::a::b` path and every `super::` path outside
//! comments and test code (items under `#[cfg(test)]`, and the files of test modules), with `{..}`
//! groups expanded, resolved to the longest prefix that is a file of either crate.
use std::collections::{BTreeMap, BTreeSet};

/// A module: its path below `src/` (or the engines' `src/`) without `.rs` or `mod.rs`
/// (`["broker", "message"]`); the daemon crate's root (`lib.rs`, `main.rs`) is empty.
type Module = Vec<String>;

struct Source {
    /// The code outside comments and test items.
    code: String,
    /// Child modules declared under `#[cfg(test)]`.
    test_modules: Vec<String>,
}

/// Every module of `src/` but the test-only ones.
fn sources() -> BTreeMap<Module, Source> {
    let mut all = all_sources();
    let test_only: Vec<Module> = all
        .iter()
        .flat_map(|(module, source)| {
            source.test_modules.iter().map(move |child| {
                // The engines' crate root (`lib`) declares top-level modules, like the daemon's.
                let mut path = if *module == ["lib"] {
                    Module::new()
                } else {
                    module.clone()
                };
                path.push(child.clone());
                path
            })
        })
        .collect();
    for module in test_only {
        all.remove(&module);
    }
    all
}

fn all_sources() -> BTreeMap<Module, Source> {
    let repo = crate::support::repo();
    let mut out = BTreeMap::new();
    for (root, is_engines) in [
        (repo.join("src"), false),
        (repo.join(ENGINES_CRATE).join("src"), true),
    ] {
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let relative = path.strip_prefix(&root).unwrap().with_extension("");
                let mut module: Module = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if module.last().is_some_and(|l| l == "mod") {
                    module.pop();
                }
                // The daemon's crate root is the empty module; the engines' root keeps the name
                // `lib` (it only declares their modules, and "lib" may import anything).
                if !is_engines && (module == ["lib"] || module == ["main"]) {
                    module.clear();
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let (code, test_modules) = code_of(&text);
                let clash = out.insert(module.clone(), Source { code, test_modules });
                assert!(
                    !is_engines || clash.is_none(),
                    "{module:?} is a module of both crates"
                );
            }
        }
    }
    out
}

/// The text without line comments and without the items under `#[cfg(test)]` (test modules,
/// inline or in files of their own, and test helpers); the names of test-only module files.
fn code_of(text: &str) -> (String, Vec<String>) {
    let mut code = Vec::new();
    let mut test_modules = Vec::new();
    let mut lines = text.lines().map(|line| match line.find("//") {
        Some(at) => &line[..at],
        None => line,
    });
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            code.push(line);
            continue;
        }
        // Skip the item: up to a `;` outside braces, or until its braces close.
        let mut depth = 0i64;
        for item in lines.by_ref() {
            let declared = item.trim_start().trim_start_matches("pub(crate) ");
            if depth == 0
                && let Some(name) = declared
                    .strip_prefix("mod ")
                    .and_then(|r| r.strip_suffix(';'))
            {
                test_modules.push(name.trim().to_string());
            }
            depth += item.matches('{').count() as i64 - item.matches('}').count() as i64;
            let opened = item.contains('{');
            if depth <= 0 && (opened || item.trim_end().ends_with(';') || item.contains('}')) {
                break;
            }
        }
    }
    (code.join("\n"), test_modules)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path of `code` that starts with `crate::` or `super::`, `{..}` groups expanded (one level).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !is_ident(bytes[i - 1]);
        let rest: String = bytes[i..bytes.len().min(i + 7)].iter().collect();
        if !(starts_word && (rest.starts_with("crate::") || rest.starts_with("super::"))) {
            i += 1;
            continue;
        }
        // Read segments joined by `::`.
        let mut segments = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < bytes.len() && is_ident(bytes[j]) {
                j += 1;
            }
            segments.push(bytes[start..j].iter().collect::<String>());
            if j + 2 < bytes.len() && bytes[j] == ':' && bytes[j + 1] == ':' {
                j += 2;
                if bytes[j] == '{' {
                    let close = bytes[j..].iter().position(|&c| c == '}').map(|p| p + j);
                    let close = close.unwrap_or(bytes.len());
                    let group: String = bytes[j + 1..close].iter().collect();
                    for item in group.split(',') {
                        let item = item.split(" as ").next().unwrap_or("").trim();
                        if !item.is_empty() && item.chars().all(|c| is_ident(c) || c == ':') {
                            let mut path = segments.clone();
                            path.extend(item.split("::").map(str::to_string));
                            out.push(path);
                        }
                    }
                    j = close;
                    break;
                }
                continue;
            }
            break;
        }
        out.push(segments);
        i = j.max(i + 1);
    }
    out
}

/// The modules each module imports (outside its own ancestors and itself).
fn imports(sources: &BTreeMap<Module, Source>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut graph = BTreeMap::new();
    for (module, source) in sources {
        let mut deps = BTreeSet::new();
        for path in paths(&source.code) {
            let mut absolute: Vec<String> = if path[0] == "crate" {
                Vec::new()
            } else {
                // `super` of `a/b/c.rs` and of `a/b/c/mod.rs` is `a/b`.
                let mut base = module.clone();
                base.pop();
                base
            };
            let mut segments = path[1..].iter().peekable();
            while segments.peek().is_some_and(|s| *s == "super") {
                segments.next();
                absolute.pop();
            }
            absolute.extend(segments.cloned());
            let target = (1..=absolute.len())
                .rev()
                .map(|n| absolute[..n].to_vec())
                .find(|prefix| sources.contains_key(prefix));
            if let Some(target) = target {
                let ancestor = target.len() < module.len() && module.starts_with(&target);
                if target != *module && !ancestor {
                    deps.insert(target);
                }
            }
        }
        graph.insert(module.clone(), deps);
    }
    graph
}

fn name(module: &Module) -> String {
    if module.is_empty() {
        "lib".into()
    } else {
        module.join("/")
    }
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Tarjan<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        on_stack: BTreeSet<Module>,
        out: Vec<Vec<Module>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &Module) {
            let n = self.index.len();
            self.index.insert(v.clone(), n);
            self.low.insert(v.clone(), n);
            self.stack.push(v.clone());
            self.on_stack.insert(v.clone());
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v.clone(), low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v.clone(), low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(&w);
                    let done = w == *v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.out.push(component);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !tarjan.index.contains_key(v) {
            tarjan.visit(v);
        }
    }
    tarjan.out
}

#[test]
fn no_file_of_src_imports_in_a_cycle() {
    let graph = imports(&sources());
    let found: Vec<String> = cycles(&graph)
        .iter()
        .map(|c| c.iter().map(name).collect::<Vec<_>>().join(" <-> "))
        .collect();
    assert!(found.is_empty(), "import cycles: {found:#?}");
}

/// The engines' crate, below the repository's root.
const ENGINES_CRATE: &str = "crates/engines";

/// What the engines' crate may depend on: plain libraries, none with a runtime, a network, files or
/// a clock of its own (docs/architecture.md, section 1).
const ENGINE_DEPENDENCIES: [&str; 10] = [
    "csv",
    "foldhash",
    "memchr",
    "rand",
    "rand_chacha",
    "rand_distr",
    "rstar",
    "serde",
    "thiserror",
    "toml",
];

/// The top-level modules of the engines' crate.
const ENGINES: [&str; 7] = [
    "location",
    "transactions",
    "relational",
    "measures",
    "risk",
    "learning",
    "poi",
];
const SHARED: [&str; 6] = [
    "config",
    "text",
    "data_files",
    "lines",
    "budget",
    "atomic_file",
];
const STATE: [&str; 3] = ["store", "cluster", "ledger"];
const CROSS_CUTTING: [&str; 5] = ["auth", "telemetry", "connections", "tls", "reload"];
const ACTORS: [&str; 2] = ["broker", "windows"];

/// What each top-level module may import: docs/architecture.md, "What each layer may import".
fn may_import(module: &str) -> Vec<&'static str> {
    let all = |groups: &[&[&'static str]]| groups.concat();
    match module {
        // Reading a trace from any reader (the location engine) goes through the bounded `lines`.
        "location" | "transactions" | "relational" | "learning" | "poi" => {
            vec!["text", "budget", "lines"]
        }
        "measures" => vec!["relational", "learning", "text", "budget"],
        "risk" => vec!["relational", "text", "budget"],
        "text" | "lines" | "budget" | "atomic_file" => vec![],
        // Reading the data files: traces (the location engine's point type), road networks (the POI
        // generator's road type).
        "data_files" => vec!["lines", "text", "location", "poi"],
        // Drawing into memory: the charts of the measures (frontier, Brickell & Shmatikov's figures).
        "plots" => vec!["measures", "text", "budget"],
        "config" => all(&[&ENGINES, &["lines", "text", "data_files"]]),
        "store" | "cluster" => all(&[&ENGINES, &SHARED, &["telemetry"]]),
        // The privacy budget ledger: the store's lock and framing conventions, a bucket from cluster.
        "ledger" => all(&[&ENGINES, &SHARED, &["telemetry", "store", "cluster"]]),
        "auth" | "telemetry" | "connections" | "tls" | "reload" => all(&[&SHARED, &CROSS_CUTTING]),
        "broker" | "windows" => all(&[&ENGINES, &SHARED, &STATE, &CROSS_CUTTING]),
        // The table jobs: the runner, its limiter and budget, and the frontier's sweep, called by
        // the gRPC adapters, the workbench and the CLI.
        "jobs" => all(&[&ENGINES, &SHARED, &CROSS_CUTTING]),
        // The reference POI provider: a client of the daemon's LbsGateway (over `proto`) answering
        // with the POI engine; `cloakd provider`, `cloakd simulate` and the tests run it.
        "provider" => all(&[&ENGINES, &SHARED]),
        // Adapters: gRPC (service) and the workbench's HTTP application, side by side.
        "service" | "workbench" => all(&[
            &ENGINES,
            &SHARED,
            &STATE,
            &CROSS_CUTTING,
            &ACTORS,
            &["jobs"],
        ]),
        // The top: the daemon's wiring, the command line and the crate root import anything.
        "daemon" | "cli" | "lib" | "main" => vec!["*"],
        other => panic!(
            "top-level module {other:?} has no layer: add it to docs/architecture.md and here"
        ),
    }
}

#[test]
fn every_top_level_module_imports_only_what_its_layer_may() {
    let graph = imports(&sources());
    let mut wrong = Vec::new();
    for (module, deps) in &graph {
        let top = module.first().map(String::as_str).unwrap_or("lib");
        let allowed = may_import(top);
        for dep in deps {
            let to = dep.first().map(String::as_str).unwrap_or("lib");
            if to != top && !allowed.contains(&"*") && !allowed.contains(&to) {
                wrong.push(format!("{} imports {}", name(module), name(dep)));
            }
        }
    }
    assert!(wrong.is_empty(), "arrows against the layers: {wrong:#?}");
}

#[test]
fn the_engines_have_no_runtime_files_or_clock() {
    let forbidden = ["tokio", "tonic", "std::fs", "Instant::now", "SystemTime"];
    let mut found = Vec::new();
    for (module, source) in sources() {
        if !module
            .first()
            .is_some_and(|m| ENGINES.contains(&m.as_str()))
        {
            continue;
        }
        for word in forbidden {
            if source.code.contains(word) {
                found.push(format!("{} uses {word}", name(&module)));
            }
        }
    }
    assert!(found.is_empty(), "impure engines: {found:#?}");
}

#[test]
fn the_engines_crate_depends_only_on_plain_libraries() {
    let path = crate::support::repo()
        .join(ENGINES_CRATE)
        .join("Cargo.toml");
    let manifest: toml::Table = std::fs::read_to_string(path).unwrap().parse().unwrap();
    let dependencies = manifest["dependencies"].as_table().expect("[dependencies]");
    let unexpected: Vec<&String> = dependencies
        .keys()
        .filter(|name| !ENGINE_DEPENDENCIES.contains(&name.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "the engines' crate depends on {unexpected:?}: an engine stays plain synchronous Rust \
         (docs/architecture.md, section 1); if the crate is plain, add it to ENGINE_DEPENDENCIES"
    );
}

#[test]
fn no_file_of_src_has_over_1000_lines_of_code() {
    let mut long = Vec::new();
    for (module, source) in sources() {
        let lines = source.code.lines().filter(|l| !l.trim().is_empty()).count();
        if lines > 1000 {
            long.push(format!("{}: {lines}", name(&module)));
        }
    }
    assert!(long.is_empty(), "files over 1,000 lines of code: {long:#?}");
}

/// The `path`s of `Cargo.toml`'s `[[test]]` targets.
fn test_targets(manifest: &str) -> BTreeSet<String> {
    let manifest: toml::Table = manifest.parse().expect("Cargo.toml parses");
    manifest
        .get("test")
        .and_then(|t| t.as_array())
        .into_iter()
        .flatten()
        .filter_map(|target| target.get("path")?.as_str().map(str::to_string))
        .collect()
}

#[test]
fn every_integration_test_is_a_module_of_the_test_binary() {
    let repo = crate::support::repo();
    let targets = test_targets(&std::fs::read_to_string(repo.join("Cargo.toml")).unwrap());
    assert!(targets.contains("tests/it/main.rs"), "{targets:?}");
    let mut stray = Vec::new();
    for entry in std::fs::read_dir(repo.join("tests")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let candidate = if path.is_dir() {
            format!("tests/{name}/main.rs")
        } else {
            format!("tests/{name}")
        };
        let is_crate = if path.is_dir() {
            path.join("main.rs").is_file()
        } else {
            name.ends_with(".rs")
        };
        if is_crate && !targets.contains(&candidate) {
            stray.push(candidate);
        }
    }
    assert!(
        stray.is_empty(),
        "test crates no [[test]] target of Cargo.toml builds (make them modules of tests/it/main.rs): {stray:?}"
    );
}

#[test]
fn the_import_reader_sees_crate_and_super_paths() {
    let code = "use crate::a::{b, c::d as e};\nuse super::super::f::G;\nlet x = crate::h::i(1);";
    let found = paths(code);
    let found: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        found,
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::a",
            "super::super::f::G",
            "crate::h::i"
        ]
    );
}

#[test]
fn test_items_are_not_code() {
    let text = "use crate::a::B;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\npub(crate) fn helper() {\n    crate::c::d();\n}\nfn f() {} // crate::e\n#[cfg(test)]\nmod inline {\n    use crate::g;\n}\n";
    let (code, test_modules) = code_of(text);
    assert_eq!(test_modules, ["tests"]);
    let found: Vec<String> = paths(&code).iter().map(|p| p.join("::")).collect();
    assert_eq!(found, ["crate::a::B"]);
}
