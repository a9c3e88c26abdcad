//! The namespace's Kubernetes Events as the environment's timeline reads them (SPEC 17): parsed
//! once per Event object, not once per view. A view reads the Events' watch, reuses the entries
//! of the objects it parsed before (the same shared object, compared by address while the memo
//! holds it, so an address is never reused meanwhile) and parses only the new ones; while the
//! namespace does not change (its generation), the sorted list itself is reused.

use std::collections::HashMap;
use std::sync::Arc;

use crate::k8s::fetch;
use crate::resources::object::Object;
use crate::resources::timeline::{Entry, Events};

/// What the last read of a namespace's Events left.
#[derive(Default)]
pub(super) struct Memo {
    generation: Option<u64>,
    events: Arc<Events>,
    /// By the address of the object each entry was parsed from, with the object, so that the
    /// address stays its own.
    parsed: HashMap<usize, (Arc<Object>, Option<Entry>)>,
}

impl Memo {
    /// The Events of `objects`, read at `generation`: the same list as the last read at the
    /// same generation.
    pub(super) fn read(&mut self, generation: u64, objects: Vec<Arc<Object>>) -> Arc<Events> {
        if self.generation == Some(generation) {
            return self.events.clone();
        }
        let mut before = std::mem::take(&mut self.parsed);
        let mut entries = Vec::with_capacity(objects.len());
        for object in objects {
            let address = Arc::as_ptr(&object) as usize;
            let entry = match before.remove(&address) {
                Some((_, entry)) => entry,
                None => fetch::timeline_entry(&object.text()),
            };
            entries.extend(entry.clone());
            self.parsed.insert(address, (object, entry));
        }
        self.events = Arc::new(Events::new(entries));
        self.generation = Some(generation);
        self.events.clone()
    }
}
