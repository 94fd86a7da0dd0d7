//! A deep scrub after recovery: every member's digests, compared.

use super::recovery::next_cursor;
use super::*;

impl Peering {
    pub(super) fn scrub_step(
        &mut self,
        recovery: &mut Recovery,
        scrub: &mut Scrub,
        reply: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        if let Some((member, cursor, mut objects)) = scrub.listing.take() {
            let Some(PeerReply::Digests { objects: page, more }) = reply else {
                return Err(format!("unexpected answer {reply:?} during a scrub"));
            };
            let cursor = next_cursor(&cursor, &page, more).ok_or("a digest listing did not advance")?;
            objects.extend(page);
            if more {
                scrub.listing = Some((member, cursor.clone(), objects));
                return Ok(Some((member, PeerOp::Digests { cursor })));
            }
            scrub.digests.insert(member, objects);
        }
        if let Some(member) = scrub.to_list.pop_front() {
            scrub.listing = Some((member, Vec::new(), Vec::new()));
            return Ok(Some((member, PeerOp::Digests { cursor: Vec::new() })));
        }
        let (report, repairs) = compare(recovery.authority, &self.members, &scrub.digests);
        if scrub.repair {
            let mut report = report;
            report.repaired = repairs.len() as u64;
            recovery.work.extend(repairs);
            scrub.report = Some(report);
        } else {
            scrub.report = Some(report);
        }
        Ok(None)
    }
}

/// A deep scrub's verdict over every member's digests: which copies are
/// bad, and the work that would replace them. The good copy of an object is
/// the authority's when readable, else the first readable one (in member
/// order); whether an object exists at all is the authority's call.
fn compare(
    authority: OsdId,
    members: &[OsdId],
    digests: &BTreeMap<OsdId, Vec<ObjectDigest>>,
) -> (ScrubReport, Vec<Work>) {
    debug_assert!(members.contains(&authority), "the scrub's authority osd.{authority} is no member");
    let mut copies: BTreeMap<&[u8], BTreeMap<OsdId, Option<u32>>> = BTreeMap::new();
    for (member, listed) in digests {
        for d in listed {
            copies.entry(d.object.as_slice()).or_default().insert(*member, d.digest);
        }
    }
    let mut report = ScrubReport { objects: copies.len() as u64, ..ScrubReport::default() };
    let mut work = Vec::new();
    for (object, held) in copies {
        let Some(on_authority) = held.get(&authority) else {
            let bad: Vec<OsdId> = held.keys().copied().collect();
            work.extend(bad.iter().map(|on| Work::Remove { object: object.to_vec(), on: *on }));
            report.inconsistent.push(Inconsistency { object: object.to_vec(), bad, unrepairable: false });
            continue;
        };
        let good = on_authority
            .map(|digest| (authority, digest))
            .or_else(|| members.iter().find_map(|m| held.get(m).copied().flatten().map(|digest| (*m, digest))));
        let bad: Vec<OsdId> = members
            .iter()
            .copied()
            .filter(|m| good.is_none_or(|(_, digest)| held.get(m) != Some(&Some(digest))))
            .collect();
        if bad.is_empty() {
            continue;
        }
        debug_assert!(good.is_none_or(|(from, _)| !bad.contains(&from)), "the good copy is judged bad");
        if let Some((from, _)) = good {
            work.extend(bad.iter().map(|to| Work::Copy { object: object.to_vec(), from, to: *to }));
        }
        report.inconsistent.push(Inconsistency { object: object.to_vec(), bad, unrepairable: good.is_none() });
    }
    (report, work)
}
