//! Leader rotation, when configured: after `rotate_leader_after_jobs` new jobs in one term,
//! leadership is handed to the next member (running attempts are re-adopted there). A
//! submission applying only notes that a rotation is due; the hand-over starts once applying is
//! done, because it can end this member's leadership at once and entries still being applied
//! must not meet a leader state whose member no longer leads.

use super::LeaderState;
use crate::coordinator::member::Member;
use crate::coordinator::Event;

/// New jobs accepted in this term, and whether they call for a hand-over.
#[derive(Debug, Default)]
pub(super) struct Rotation {
    submitted_this_term: u64,
    due: bool,
}

impl LeaderState {
    /// A new job was accepted in this term.
    pub(super) fn count_submission_for_rotation(&mut self, m: &Member) {
        let rotation = &mut self.rotation;
        rotation.submitted_this_term += 1;
        if m.config
            .rotate_leader_after_jobs
            .is_some_and(|after| rotation.submitted_this_term >= after)
        {
            rotation.due = true;
        }
    }

    /// Starts the rotation noted while applying, if one is due and none is under way; true if
    /// a hand-over started (the caller settles the role change it may bring).
    pub(in crate::coordinator) fn start_rotation_if_due(&mut self, m: &mut Member) -> bool {
        if !std::mem::take(&mut self.rotation.due) || m.replica.transferring_to().is_some() {
            return false;
        }
        match m.replica.transfer_leadership(None) {
            Ok(to) => {
                m.event(Event::TransferStarted { to });
                true
            }
            Err(_) => false,
        }
    }
}
