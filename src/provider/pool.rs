//! The provider's bounded worker pool: a fixed number of threads computing answers, fed through a
//! bounded queue. The Subscribe loop never computes an answer itself, so it keeps reading (and
//! acknowledging) whatever the broker sends; when the queue is full it sheds the request instead of
//! waiting ([`Pool::try_submit`] hands the job back).
//!
//! Invariants: at most `threads` jobs run and at most `depth` wait; a job that panics is logged and
//! its thread goes on with the next one; closing the pool ([`Pool::finish`]) lets the queued jobs run
//! to the end. Plain threads, not tokio's: answers are CPU-bound work of up to milliseconds.
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;

/// One unit of work (computing and sending one answer).
pub type Job = Box<dyn FnOnce() + Send + 'static>;

pub struct Pool {
    jobs: async_channel::Sender<Job>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `threads` workers (at least one) behind a queue of `depth` jobs (at least one).
    pub fn new(threads: usize, depth: usize) -> std::io::Result<Pool> {
        let (jobs, queue) = async_channel::bounded::<Job>(depth.max(1));
        let workers = (0..threads.max(1))
            .map(|i| {
                let queue = queue.clone();
                std::thread::Builder::new()
                    .name(format!("poi-worker-{i}"))
                    .spawn(move || {
                        while let Ok(job) = queue.recv_blocking() {
                            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                                tracing::error!("a POI query panicked; its request gets no answer");
                            }
                        }
                    })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Pool { jobs, workers })
    }

    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Jobs waiting for a worker.
    pub fn queued(&self) -> usize {
        self.jobs.len()
    }

    /// Whether the next [`Pool::try_submit`] would be refused. Only submitters fill the queue, so
    /// for a single submitter `false` stays true until it submits.
    pub fn is_full(&self) -> bool {
        self.jobs.is_full()
    }

    /// Queues a job, or hands it back when the queue is full (or the pool is closed).
    pub fn try_submit(&self, job: Job) -> Result<(), Job> {
        self.jobs.try_send(job).map_err(|e| e.into_inner())
    }

    /// Takes no more jobs, lets the workers run the queued ones, and waits for them.
    pub fn finish(mut self) {
        self.jobs.close();
        for worker in std::mem::take(&mut self.workers) {
            let _ = worker.join();
        }
    }
}

impl Drop for Pool {
    /// Closes the queue (the workers end once it is empty) without waiting for them.
    fn drop(&mut self) {
        self.jobs.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_full_queue_hands_the_job_back_and_queued_jobs_finish() {
        let pool = Pool::new(1, 2).unwrap();
        let (started, wait_started) = mpsc::channel();
        let (release, gate) = mpsc::channel::<()>();
        let (done, finished) = mpsc::channel();
        // The one worker is busy until released.
        pool.try_submit(Box::new(move || {
            started.send(()).unwrap();
            let _ = gate.recv();
        }))
        .unwrap_or_else(|_| panic!("refused"));
        wait_started.recv().unwrap();
        for i in 0..2 {
            let done = done.clone();
            assert!(!pool.is_full());
            pool.try_submit(Box::new(move || done.send(i).unwrap()))
                .unwrap_or_else(|_| panic!("refused {i}"));
        }
        assert!(pool.is_full());
        assert_eq!(pool.queued(), 2);
        let shed = pool.try_submit(Box::new(|| panic!("a shed job ran")));
        assert!(shed.is_err(), "the third job was queued");
        release.send(()).unwrap();
        pool.finish();
        drop(done);
        assert_eq!(finished.iter().collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn a_panicking_job_does_not_take_its_worker() {
        let pool = Pool::new(1, 4).unwrap();
        let (done, finished) = mpsc::channel();
        pool.try_submit(Box::new(|| panic!("boom")))
            .unwrap_or_else(|_| panic!("refused"));
        pool.try_submit(Box::new(move || done.send(7).unwrap()))
            .unwrap_or_else(|_| panic!("refused"));
        pool.finish();
        assert_eq!(finished.recv().unwrap(), 7);
    }
}
