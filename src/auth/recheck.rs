//! A long-lived socket's access, judged again every period (SPEC 13): a refusal ends it at
//! once. A judgement that cannot be made (the database away, say) keeps the last decision for
//! at most [`UNDECIDED`] periods in a row, then ends the socket too: access fails closed, and a
//! blip of the database does not close every socket at once.

/// Periods in a row without a decision that end a socket.
pub const UNDECIDED: u32 = 3;

/// Counts the periods in a row whose judgement could not be made.
#[derive(Debug, Default)]
pub struct Undecided(u32);

impl Undecided {
    /// A judgement was made.
    pub fn decided(&mut self) {
        self.0 = 0;
    }

    /// A judgement could not be made: whether the socket must end now.
    pub fn failed(&mut self) -> bool {
        self.0 += 1;
        self.0 >= UNDECIDED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_decision_stands_for_a_bounded_number_of_failed_judgements() {
        let mut u = Undecided::default();
        assert!(!u.failed());
        assert!(!u.failed());
        u.decided();
        assert!(!u.failed());
        assert!(!u.failed());
        assert!(u.failed(), "the third in a row ends it");
    }
}
