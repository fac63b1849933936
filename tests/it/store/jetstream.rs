//! The store suite ([`crate::support::store`]) against the JetStream stores, on real `nats-server`
//! processes (`crate::support::nats`): each check gets its own server; the model test's cases get a
//! fresh subject prefix (an independent deployment) each on one server. Opening the same prefix
//! again is a restart. Also: a 3-node cluster with replication 3 loses nothing acknowledged when a node is
//! killed and restarted. Batch messages carry a message id of stream, fence and content: a batch
//! republished byte for byte is a JetStream duplicate, and an append whose batch was stored before
//! its PubAck was lost is acknowledged, once (the loss made by a proxy that swallows the PubAck
//! and drops the connection, so the log's retry is what acknowledges it). And the fence: a writer whose view of a stream is stale cannot append to
//! it, so two writers racing on one stream leave a log whose every window close follows exactly its
//! records, with every acknowledged record in it once.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_nats::jetstream::context::PublishErrorKind;
use cloakd::store::jetstream::{BatchMessage, JetStreamRecordLog, JetStreamReleases, Layout};
use cloakd::store::{EntryOutcome, LogEntry};
use cloakd::store::{LogPosition, RecordLog};

use crate::support::nats::NatsCluster;
use crate::support::store::{Opened, Stores, close, record};

/// Upper bound on a failover (liveness, not timing).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// A deployment: a subject prefix on a shared server.
struct JetStreamStores {
    nats: Arc<NatsCluster>,
    prefix: String,
}

fn next_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("suite{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

impl JetStreamStores {
    async fn fresh() -> JetStreamStores {
        JetStreamStores {
            nats: Arc::new(NatsCluster::single().await),
            prefix: next_prefix(),
        }
    }
}

/// Connects to the comma-separated servers of `url`.
async fn connect(url: &str) -> async_nats::jetstream::Context {
    let servers: Vec<async_nats::ServerAddr> = url.split(',').map(|u| u.parse().unwrap()).collect();
    let client = async_nats::connect(servers)
        .await
        .expect("nats-server answers");
    async_nats::jetstream::new(client)
}

impl Stores for JetStreamStores {
    fn open(&self) -> Pin<Box<dyn Future<Output = Opened> + Send + '_>> {
        Box::pin(async move {
            let js = connect(&self.nats.url()).await;
            let layout = Layout {
                prefix: self.prefix.clone(),
                replicas: 1,
            };
            let log = JetStreamRecordLog::open(js.clone(), layout.clone())
                .await
                .unwrap();
            let releases = JetStreamReleases::open(js, layout).await.unwrap();
            Opened {
                log: Arc::new(log),
                releases: Arc::new(releases),
            }
        })
    }

    fn another(&self) -> JetStreamStores {
        JetStreamStores {
            nats: self.nats.clone(),
            prefix: next_prefix(),
        }
    }
}

crate::store_suite!(JetStreamStores::fresh());

#[tokio::test]
async fn a_restarted_node_of_three_loses_nothing_acknowledged() {
    let mut nats = NatsCluster::three().await;
    let layout = Layout {
        prefix: "replicated".into(),
        replicas: 3,
    };
    let js = connect(&nats.url()).await;
    let log = JetStreamRecordLog::open(js, layout.clone()).await.unwrap();
    let mut acknowledged = Vec::new();
    for i in 0..40u64 {
        if i == 15 {
            nats.kill(1);
        }
        if i == 30 {
            nats.restart(1).await;
        }
        let batch = vec![record("s", i, &format!("r{i}"), &["x"]), close("s", i, 1)];
        // While the stream's leader moves an append may fail (nothing acknowledged, but it may
        // be stored); as the writer does, the log is replayed and the batch appended again, and
        // ids keep the retry from storing anything twice.
        let started = std::time::Instant::now();
        while let Err(e) = log.append(batch.clone()).await {
            assert!(started.elapsed() < PATIENCE, "appends fail for good: {e}");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let _ = log.replay(LogPosition::START).await;
        }
        acknowledged.extend(batch);
    }
    // Read back through the restarted node alone.
    let js = connect(&nats.node_url(1)).await;
    let log = JetStreamRecordLog::open(js, layout).await.unwrap();
    assert_eq!(
        log.replay(LogPosition::START).await.unwrap().entries,
        acknowledged
    );
}

/// Messages in the record stream of `prefix`.
async fn stored_messages(js: &async_nats::jetstream::Context, prefix: &str) -> u64 {
    let name = format!("{}_RECORDS", prefix.to_ascii_uppercase());
    let mut stream = js.get_stream(name).await.unwrap();
    stream.info().await.unwrap().state.messages
}

/// On a replicated stream, a batch message published again byte for byte (same id, same expected
/// sequence, same payload), as a retry after a lost PubAck does, is answered `duplicate = true`
/// with the original sequence and stored once, although the expected sequence no longer holds;
/// another batch at the same fence is still refused by it.
#[tokio::test]
async fn a_republished_batch_is_a_duplicate_of_the_first() {
    let nats = NatsCluster::three().await;
    let layout = Layout {
        prefix: "dedup".into(),
        replicas: 3,
    };
    let js = connect(&nats.url()).await;
    let log = JetStreamRecordLog::open(js.clone(), layout.clone())
        .await
        .unwrap();
    let first = record("s", 0, "r1", &["x"]);
    log.append(vec![first.clone()]).await.unwrap();
    let message = BatchMessage::new(&layout, "s", 0, vec![first.encode()]);
    // It is what the log published.
    let name = "DEDUP_RECORDS";
    let stored = js
        .get_stream(name)
        .await
        .unwrap()
        .get_raw_message(1)
        .await
        .unwrap();
    assert_eq!(stored.subject.as_str(), message.subject);
    assert_eq!(stored.payload, message.payload);
    assert_eq!(
        stored
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str()),
        Some(message.message_id.as_str())
    );
    let again = message.send(&js).await.unwrap();
    assert!(again.duplicate, "{again:?}");
    assert_eq!(again.sequence, 1);
    assert_eq!(stored_messages(&js, "dedup").await, 1);
    // Another batch at fence 0: another id, refused by the fence.
    let other = BatchMessage::new(&layout, "s", 0, vec![record("s", 0, "r2", &["x"]).encode()]);
    assert_ne!(other.message_id, message.message_id);
    let refused = other.send(&js).await.unwrap_err();
    assert_eq!(refused.kind(), PublishErrorKind::WrongLastSequence);
    assert_eq!(stored_messages(&js, "dedup").await, 1);
    // The log goes on from sequence 1.
    log.append(vec![record("s", 0, "r2", &["x"])])
        .await
        .unwrap();
    assert_eq!(stored_messages(&js, "dedup").await, 2);
}

/// The batch an append is about to publish is stored first, as if an earlier attempt of the same
/// append had been stored and its PubAck lost: the append is acknowledged (every entry appended),
/// nothing is stored twice, and the log appends on top of it. On a replicated stream the retry is a
/// JetStream duplicate; on one replica, where nats-server checks the expected sequence before the
/// id, the log finds its message as the last on the subject.
async fn a_batch_stored_before_its_ack_was_lost_is_acknowledged(
    nats: NatsCluster,
    replicas: usize,
) {
    let prefix = format!("lost{replicas}");
    let layout = Layout {
        prefix: prefix.clone(),
        replicas,
    };
    let js = connect(&nats.url()).await;
    let log = JetStreamRecordLog::open(js.clone(), layout.clone())
        .await
        .unwrap();
    log.append(vec![record("s", 0, "r1", &["x"])])
        .await
        .unwrap();
    let batch = vec![record("s", 0, "r2", &["x"]), close("s", 0, 2)];
    let message = BatchMessage::new(
        &layout,
        "s",
        1,
        batch.iter().map(LogEntry::encode).collect(),
    );
    let ack = message.send(&js).await.unwrap();
    assert_eq!((ack.sequence, ack.duplicate), (2, false));
    assert_eq!(
        log.append(batch.clone()).await.unwrap(),
        [EntryOutcome::Appended, EntryOutcome::Appended]
    );
    assert_eq!(stored_messages(&js, &prefix).await, 2);
    log.append(vec![record("s", 1, "r3", &["x"])])
        .await
        .unwrap();
    // A different batch stored at the fence is another writer's: refused, not taken for ours.
    let theirs = BatchMessage::new(&layout, "s", 3, vec![record("s", 1, "t1", &["x"]).encode()]);
    theirs.send(&js).await.unwrap();
    let refused = log
        .append(vec![record("s", 1, "r4", &["x"])])
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("another writer"), "{refused}");
    let reader = JetStreamRecordLog::open(connect(&nats.url()).await, layout)
        .await
        .unwrap();
    assert_eq!(
        reader.replay(LogPosition::START).await.unwrap().entries,
        [
            record("s", 0, "r1", &["x"]),
            record("s", 0, "r2", &["x"]),
            close("s", 0, 2),
            record("s", 1, "r3", &["x"]),
            record("s", 1, "t1", &["x"]),
        ]
    );
}

#[tokio::test]
async fn a_lost_ack_on_one_replica_is_found_stored() {
    a_batch_stored_before_its_ack_was_lost_is_acknowledged(NatsCluster::single().await, 1).await;
}

#[tokio::test]
async fn a_lost_ack_on_three_replicas_is_a_duplicate() {
    a_batch_stored_before_its_ack_was_lost_is_acknowledged(NatsCluster::three().await, 3).await;
}

/// A TCP proxy in front of one NATS server that loses one PubAck: the first message published
/// (`HPUB`) on a subject starting with `subject_prefix` is forwarded whole; the server's answer to
/// it (on the message's reply subject, so the message is stored) is swallowed, and the client's
/// connection is then dropped. Every other connection, before and after, passes through.
struct AckLosingProxy {
    url: String,
    lost: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AckLosingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AckLosingProxy {
    async fn start(server_url: &str, subject_prefix: &str) -> AckLosingProxy {
        let server: std::net::SocketAddr =
            server_url.trim_start_matches("nats://").parse().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("nats://{}", listener.local_addr().unwrap());
        let lost = Arc::new(AtomicU64::new(0));
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let marker = format!("HPUB {subject_prefix}").into_bytes();
        let task = tokio::spawn({
            let lost = lost.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(upstream) = tokio::net::TcpStream::connect(server).await else {
                        continue;
                    };
                    tokio::spawn(Self::relay(
                        client,
                        upstream,
                        marker.clone(),
                        armed.clone(),
                        lost.clone(),
                    ));
                }
            }
        });
        AckLosingProxy { url, lost, task }
    }

    /// `HPUB <subject> <reply> <header bytes> <total bytes>\r\n` at `at` in `seen`, if whole:
    /// the reply subject and where the message ends.
    fn hpub_at(seen: &[u8], at: usize) -> Option<(String, usize)> {
        let line_len = seen[at..].windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&seen[at..at + line_len]).unwrap();
        let tokens: Vec<&str> = line.split(' ').collect();
        assert_eq!(tokens.len(), 5, "HPUB with a reply subject: {line}");
        let total: usize = tokens[4].parse().unwrap();
        Some((tokens[2].to_string(), at + line_len + 2 + total + 2))
    }

    async fn relay(
        client: tokio::net::TcpStream,
        upstream: tokio::net::TcpStream,
        marker: Vec<u8>,
        armed: Arc<std::sync::atomic::AtomicBool>,
        lost: Arc<AtomicU64>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = upstream.into_split();
        // Set to the reply subject whose answer is to be lost; the answer seen, `answered` fires.
        let (cut_tx, mut cut_rx) = tokio::sync::watch::channel(None::<String>);
        let (answered_tx, answered_rx) = tokio::sync::oneshot::channel::<()>();
        let down = tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut swallowed = Vec::new();
            loop {
                let n = match server_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let reply = cut_rx.borrow_and_update().clone();
                match reply {
                    None => {
                        if client_write.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    Some(reply) => {
                        swallowed.extend_from_slice(&buf[..n]);
                        let needle = format!("MSG {reply} ");
                        if swallowed
                            .windows(needle.len())
                            .any(|w| w == needle.as_bytes())
                        {
                            let _ = answered_tx.send(());
                            return; // drops the client's write half
                        }
                    }
                }
            }
        });
        let mut buf = vec![0u8; 64 * 1024];
        let mut seen = Vec::new();
        let mut cut: Option<usize> = None;
        let mut armed_here = true;
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if armed_here && cut.is_none() {
                seen.extend_from_slice(&buf[..n]);
                let found = seen
                    .windows(marker.len())
                    .position(|w| w == marker.as_slice())
                    .and_then(|at| Self::hpub_at(&seen, at));
                if let Some((reply, end)) = found {
                    armed_here = armed.swap(false, Ordering::SeqCst);
                    if armed_here {
                        // Before the message reaches the server: its answer cannot pass.
                        cut_tx.send_replace(Some(reply));
                        cut = Some(end);
                    }
                }
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
            if cut.is_some_and(|end| seen.len() >= end) {
                // The message is with the server: wait for its (lost) answer, then hang up.
                if answered_rx.await.is_ok() {
                    lost.fetch_add(1, Ordering::SeqCst);
                }
                break;
            }
        }
        drop(server_write);
        drop(client_read);
        let _ = down.await;
    }
}

/// A publish whose PubAck is lost on the way back (the batch is stored; the connection drops) is
/// retried by the log with the identical message, and the append is acknowledged with the batch
/// stored once.
async fn a_lost_pub_ack_is_retried(nats: NatsCluster, replicas: usize) {
    let prefix = format!("cut{replicas}");
    let layout = Layout {
        prefix: prefix.clone(),
        replicas,
    };
    // The stream is created with the client's default timeout: on three replicas that takes a
    // raft election, which a loaded machine may not finish within the short timeout below.
    JetStreamRecordLog::open(connect(&nats.url()).await, layout.clone())
        .await
        .unwrap();
    let proxy = AckLosingProxy::start(&nats.node_url(0), &format!("{prefix}.records.")).await;
    let mut js = connect(&proxy.url).await;
    // The lost answer is waited for this long before the retry (the default is 5 s).
    js.set_timeout(std::time::Duration::from_secs(1));
    // Opening a log that exists is a lookup and a replay; like the daemon (which retries opening
    // while JetStream elects leaders), a request that timed out is tried again.
    let mut attempts = 0;
    let log = loop {
        match JetStreamRecordLog::open(js.clone(), layout.clone()).await {
            Ok(log) => break log,
            Err(e) if attempts < 5 => {
                attempts += 1;
                eprintln!("opening through the proxy: {e}; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            Err(e) => panic!("opening through the proxy: {e}"),
        }
    };
    let batch = vec![record("s", 0, "r1", &["x"]), close("s", 0, 1)];
    assert_eq!(
        log.append(batch.clone()).await.unwrap(),
        [EntryOutcome::Appended, EntryOutcome::Appended]
    );
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 1, "a PubAck was lost");
    log.append(vec![record("s", 1, "r2", &["x"])])
        .await
        .unwrap();
    let js = connect(&nats.url()).await;
    assert_eq!(stored_messages(&js, &prefix).await, 2);
    let reader = JetStreamRecordLog::open(js, layout).await.unwrap();
    assert_eq!(
        reader.replay(LogPosition::START).await.unwrap().entries,
        [
            record("s", 0, "r1", &["x"]),
            close("s", 0, 1),
            record("s", 1, "r2", &["x"]),
        ]
    );
}

#[tokio::test]
async fn a_lost_pub_ack_on_one_replica_is_retried() {
    a_lost_pub_ack_is_retried(NatsCluster::single().await, 1).await;
}

#[tokio::test]
async fn a_lost_pub_ack_on_three_replicas_is_retried() {
    a_lost_pub_ack_is_retried(NatsCluster::three().await, 3).await;
}

/// Two logs on one deployment (two replicas): each appends only on top of what it has read.
#[tokio::test]
async fn a_stale_writer_is_fenced_off() {
    let nats = NatsCluster::single().await;
    let layout = Layout {
        prefix: "fenced".into(),
        replicas: 1,
    };
    let a = JetStreamRecordLog::open(connect(&nats.url()).await, layout.clone())
        .await
        .unwrap();
    a.append(vec![record("s", 0, "r1", &["x"])]).await.unwrap();
    let b = JetStreamRecordLog::open(connect(&nats.url()).await, layout.clone())
        .await
        .unwrap();
    a.append(vec![record("s", 0, "r2", &["x"])]).await.unwrap();
    // b has read window 0 with r1 only: closing it with one record is refused, nothing stored.
    let refused = b.append(vec![close("s", 0, 1)]).await.unwrap_err();
    assert!(refused.to_string().contains("another writer"), "{refused}");
    // Another stream is not fenced by it.
    b.append(vec![record("t", 0, "r1", &["y"])]).await.unwrap();
    let replayed = b.replay(LogPosition::START).await.unwrap().entries;
    assert_eq!(replayed.len(), 3, "{replayed:?}");
    b.append(vec![close("s", 0, 2)]).await.unwrap();
    // Now a is stale on s: its record for window 0 is refused; after a replay it knows b's close
    // and its ids.
    assert!(a.append(vec![record("s", 0, "r3", &["x"])]).await.is_err());
    assert!(a.append(vec![record("t", 0, "r9", &["y"])]).await.is_err());
    a.replay(LogPosition::START).await.unwrap();
    assert_eq!(
        a.windows_of(&[("t", "r1"), ("s", "r3")]).await.unwrap(),
        [Some(0), None]
    );
    assert_eq!(
        a.append(vec![
            record("s", 1, "r3", &["x"]),
            record("t", 0, "r1", &["y"])
        ])
        .await
        .unwrap(),
        [
            EntryOutcome::Appended,
            EntryOutcome::Duplicate { window_id: 0 }
        ]
    );
    let log = JetStreamRecordLog::open(connect(&nats.url()).await, layout)
        .await
        .unwrap();
    assert_eq!(
        log.replay(LogPosition::START).await.unwrap().entries,
        [
            record("s", 0, "r1", &["x"]),
            record("s", 0, "r2", &["x"]),
            record("t", 0, "r1", &["y"]),
            close("s", 0, 2),
            record("s", 1, "r3", &["x"]),
        ]
    );
}

/// A writer as the window writer is one, reduced to one stream: records go into the open window,
/// a close names the records it holds; a failed append acknowledges nothing and the state is
/// rebuilt from a replay.
struct MiniWriter {
    log: JetStreamRecordLog,
    open: u64,
    records: u64,
    acknowledged: Vec<String>,
    refused: usize,
}

impl MiniWriter {
    async fn rebuild(&mut self) {
        let Ok(replayed) = self.log.replay(LogPosition::START).await else {
            return;
        };
        (self.open, self.records) = (0, 0);
        for entry in replayed.entries {
            match entry {
                LogEntry::Record(_) => self.records += 1,
                LogEntry::Close(c) => (self.open, self.records) = (c.window_id + 1, 0),
            }
        }
    }

    async fn step(&mut self, id: String, close_after: bool) {
        let mut batch = vec![record("s", self.open, &id, &["x"])];
        if close_after {
            batch.push(close("s", self.open, self.records + 1));
        }
        match self.log.append(batch).await {
            Ok(outcomes) => {
                assert_eq!(outcomes[0], EntryOutcome::Appended, "{id} is new");
                self.acknowledged.push(id);
                self.records += 1;
                if close_after {
                    (self.open, self.records) = (self.open + 1, 0);
                }
            }
            Err(_) => {
                self.refused += 1;
                self.rebuild().await
            }
        }
    }
}

/// Two writers race on one stream, each replaying whenever its append is refused: the log stays
/// well formed (each close follows exactly the records of its window, which carry its id) and holds
/// every acknowledged record exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_leave_a_well_formed_log() {
    use rand::{Rng, SeedableRng};
    let nats = NatsCluster::single().await;
    let layout = Layout {
        prefix: "race".into(),
        replicas: 1,
    };
    let mut writers = Vec::new();
    for (name, seed) in [("a", 1u64), ("b", 2)] {
        let log = JetStreamRecordLog::open(connect(&nats.url()).await, layout.clone())
            .await
            .unwrap();
        writers.push(tokio::spawn(async move {
            let mut writer = MiniWriter {
                log,
                open: 0,
                records: 0,
                acknowledged: Vec::new(),
                refused: 0,
            };
            writer.rebuild().await;
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            for i in 0..150 {
                writer
                    .step(format!("{name}{i}"), rng.random_bool(0.2))
                    .await;
                if rng.random_bool(0.3) {
                    tokio::task::yield_now().await;
                }
            }
            (writer.acknowledged, writer.refused)
        }));
    }
    let (mut acknowledged, mut refused) = (Vec::new(), 0);
    for writer in writers {
        let (ids, refusals) = writer.await.unwrap();
        acknowledged.extend(ids);
        refused += refusals;
    }
    let log = JetStreamRecordLog::open(connect(&nats.url()).await, layout)
        .await
        .unwrap();
    let entries = log.replay(LogPosition::START).await.unwrap().entries;
    let (mut open, mut in_window) = (0u64, 0u64);
    let mut stored = Vec::new();
    for entry in &entries {
        match entry {
            LogEntry::Record(r) => {
                assert_eq!(
                    r.window_id, open,
                    "record {} outside the open window",
                    r.record_id
                );
                in_window += 1;
                stored.push(r.record_id.clone());
            }
            LogEntry::Close(c) => {
                assert_eq!(c.window_id, open, "closes in order");
                assert_eq!(
                    c.records, in_window,
                    "window {open} closed with its records"
                );
                (open, in_window) = (open + 1, 0);
            }
        }
    }
    let mut unique = stored.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), stored.len(), "a record stored twice");
    for id in &acknowledged {
        assert!(stored.contains(id), "acknowledged {id} is not in the log");
    }
    assert!(acknowledged.len() > 100, "the writers made progress");
    // The writers did race: some appends met the fence.
    assert!(refused > 0, "no append was refused");
}
