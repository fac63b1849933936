//! TEMPORARY naive engine so the daemon compiles until the real CliqueCloak engine lands.
use super::*;
pub struct Engine {
    pending: Vec<CloakRequest>,
    seed: u64,
}
impl Engine {
    pub fn new(_search: SearchMode, seed: u64) -> Engine {
        Engine {
            pending: Vec::new(),
            seed,
        }
    }
    pub fn submit(&mut self, req: CloakRequest, out: &mut Vec<Outcome>) -> Result<(), SubmitError> {
        self.expire(req.arrival_ms, out);
        self.pending.push(req);
        let k = self.pending.iter().map(|r| r.k).max().unwrap_or(1) as usize;
        if self.pending.len() >= k {
            let mut b = GeoBox::point(self.pending[0].lat, self.pending[0].lon);
            for r in &self.pending {
                b.extend(r.lat, r.lon);
            }
            let members = self
                .pending
                .drain(..)
                .map(|r| {
                    self.seed += 1;
                    (r.id, Pseudonym(self.seed as u128))
                })
                .collect();
            out.push(Outcome::Cloaked(CloakedGroup {
                members,
                cloaking_box: b,
                t_start_ms: 0,
                t_end_ms: 0,
            }));
        }
        Ok(())
    }
    pub fn expire(&mut self, now_ms: i64, out: &mut Vec<Outcome>) {
        let (gone, keep): (Vec<_>, Vec<_>) = self
            .pending
            .drain(..)
            .partition(|r| r.deadline_ms() < now_ms);
        self.pending = keep;
        for r in gone {
            out.push(Outcome::Expired {
                id: r.id,
                deadline_ms: r.deadline_ms(),
            });
        }
    }
    pub fn cancel(&mut self, id: RequestId) -> bool {
        let n = self.pending.len();
        self.pending.retain(|r| r.id != id);
        n != self.pending.len()
    }
    pub fn next_deadline(&self) -> Option<i64> {
        self.pending.iter().map(|r| r.deadline_ms()).min()
    }
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}
