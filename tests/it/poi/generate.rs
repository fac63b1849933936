//! `cloakd poi generate` as a user runs it: a small road network in, a POI CSV the provider reads
//! out (the same for the same seed); a broken network refused naming the file, the line and the
//! field, with no output written.
use std::path::Path;
use std::process::Output;

use cloakd::poi::pois_csv::{TableLimits, read_pois};

fn generate(nodes: &Path, edges: &Path, output: &Path, seed: &str) -> Output {
    crate::support::bin()
        .args(["poi", "generate", "--count", "200", "--seed", seed])
        .arg("--nodes")
        .arg(nodes)
        .arg("--edges")
        .arg(edges)
        .arg("--output")
        .arg(output)
        .output()
        .unwrap()
}

const NODES: &str = "node_id,lat,lon,x_m,y_m\n\
                     1,53.1791,8.1751,0,0\n\
                     2,53.1770,8.1786,0,0\n\
                     3,53.1702,8.2011,0,0\n";

#[test]
fn a_road_network_becomes_a_poi_file_the_provider_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, edges) = (dir.path().join("nodes.csv"), dir.path().join("edges.csv"));
    std::fs::write(&nodes, NODES).unwrap();
    std::fs::write(
        &edges,
        "edge_id,from,to,class,length_m\n10,1,2,1,300\n11,2,3,3,1700\n",
    )
    .unwrap();

    let (a, b) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
    for out in [&a, &b] {
        let run = generate(&nodes, &edges, out, "5");
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let text = std::fs::read_to_string(&a).unwrap();
    assert!(text.starts_with("id,lat,lon,category,name\n"), "{text}");

    let pois = read_pois(std::fs::File::open(&a).unwrap(), &TableLimits::default()).unwrap();
    assert_eq!(pois.len(), 200);
    for p in &pois {
        // Along the two roads: inside the network's bounding box, give or take a few metres.
        assert!((53.169..=53.181).contains(&p.lat), "{}", p.lat);
        assert!((8.174..=8.202).contains(&p.lon), "{}", p.lon);
        assert!(!p.category.is_empty() && !p.name.is_empty());
    }
    let other = dir.path().join("c.csv");
    assert!(generate(&nodes, &edges, &other, "6").status.success());
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&other).unwrap());
}

#[test]
fn a_broken_network_is_refused_naming_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, edges) = (dir.path().join("nodes.csv"), dir.path().join("edges.csv"));
    std::fs::write(&nodes, NODES).unwrap();
    let out = dir.path().join("pois.csv");
    for (edges_text, wanted) in [
        (
            "edge_id,from,to,class\n10,1,2,1\n11,2,9,1\n",
            "line 3: to: no node 9",
        ),
        (
            "edge_id,from,to,class\n10,1,2,x\n",
            "line 2: class: cannot parse",
        ),
        (
            "edge_id,from,to,class\n10,1\n",
            "line 2: has 2 fields, needs at least 4",
        ),
    ] {
        std::fs::write(&edges, edges_text).unwrap();
        let run = generate(&nodes, &edges, &out, "1");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success());
        assert!(
            stderr.contains("edges.csv") && stderr.contains(wanted),
            "{wanted}: {stderr}"
        );
        assert!(!out.exists(), "nothing written on a refusal");
    }
}
