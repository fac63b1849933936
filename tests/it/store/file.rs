//! The store suite ([`crate::support::store`]) against the embedded file stores: a fresh data
//! directory per check; opening the same directory again is a restart.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use cloakd::store::{FileRecordLog, ReleasedWindows};

use crate::support::store::{Opened, Stores};

/// File stores in a temporary data directory, removed when dropped.
struct FileStores {
    dir: tempfile::TempDir,
}

impl FileStores {
    async fn fresh() -> FileStores {
        FileStores {
            dir: tempfile::tempdir().unwrap(),
        }
    }
}

impl Stores for FileStores {
    fn open(&self) -> Pin<Box<dyn Future<Output = Opened> + Send + '_>> {
        Box::pin(async move {
            let (log, _recovery) = FileRecordLog::open(self.dir.path()).unwrap();
            let releases = ReleasedWindows::open(self.dir.path()).unwrap();
            Opened {
                log: Arc::new(log),
                releases: Arc::new(releases),
            }
        })
    }

    fn another(&self) -> FileStores {
        FileStores {
            dir: tempfile::tempdir().unwrap(),
        }
    }
}

crate::store_suite!(FileStores::fresh());
