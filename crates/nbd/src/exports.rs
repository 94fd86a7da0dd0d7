//! [`ExportMap`]: a fixed set of named exports, the usual [`Exports`].

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::protocol::STRING_LEN_MAX;
use crate::{Export, Exports};

struct Entry {
    export: Arc<dyn Export>,
    description: Option<String>,
}

/// Named exports fixed at start-up. The empty name resolves to the export
/// chosen with [`ExportMap::with_default`] unless one is registered as `""`.
#[derive(Default)]
pub struct ExportMap {
    entries: BTreeMap<String, Entry>,
    default_name: Option<String>,
}

impl ExportMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the export `name`.
    ///
    /// Panics if `name` is not a valid NBD string (over 4096 bytes or with a NUL):
    /// clients could not ask for it.
    pub fn with(self, name: impl Into<String>, export: Arc<dyn Export>) -> Self {
        self.with_entry(name.into(), export, None)
    }

    /// Like [`ExportMap::with`], with a description shown by `nbdinfo --list`.
    pub fn with_description(
        self,
        name: impl Into<String>,
        export: Arc<dyn Export>,
        description: impl Into<String>,
    ) -> Self {
        let description = description.into();
        assert_valid_string(&description);
        self.with_entry(name.into(), export, Some(description))
    }

    /// Makes the empty name (the NBD default export) open `name`.
    pub fn with_default(mut self, name: impl Into<String>) -> Self {
        self.default_name = Some(name.into());
        self
    }

    fn with_entry(mut self, name: String, export: Arc<dyn Export>, description: Option<String>) -> Self {
        assert_valid_string(&name);
        self.entries.insert(name, Entry { export, description });
        self
    }

    fn resolve(&self, name: &str) -> Option<&Entry> {
        match self.entries.get(name) {
            Some(entry) => Some(entry),
            None if name.is_empty() => self.entries.get(self.default_name.as_deref()?),
            None => None,
        }
    }
}

fn assert_valid_string(value: &str) {
    assert!(value.len() <= STRING_LEN_MAX, "NBD strings are at most {STRING_LEN_MAX} bytes");
    assert!(!value.contains('\0'), "NBD strings must not contain NUL");
}

impl Exports for ExportMap {
    fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        self.resolve(name).map(|entry| Arc::clone(&entry.export))
    }

    fn description(&self, name: &str) -> Option<String> {
        self.resolve(name)?.description.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryExport;

    #[test]
    fn default_name_resolves_only_when_no_empty_entry_exists() {
        let a: Arc<dyn Export> = Arc::new(MemoryExport::new(512));
        let b: Arc<dyn Export> = Arc::new(MemoryExport::new(1024));
        let map = ExportMap::new().with_description("a", a, "first").with("b", b).with_default("b");
        assert_eq!(map.names(), vec!["a".to_string(), "b".to_string()]);
        assert_eq!(map.open("").map(|export| export.size()), Some(1024));
        assert_eq!(map.open("a").map(|export| export.size()), Some(512));
        assert!(map.open("c").is_none());
        assert_eq!(map.description("a").as_deref(), Some("first"));
        assert_eq!(map.description("b"), None);

        let empty: Arc<dyn Export> = Arc::new(MemoryExport::new(7));
        let map = map.with("", empty);
        assert_eq!(map.open("").map(|export| export.size()), Some(7));
    }

    #[test]
    fn no_default_means_empty_name_is_unknown() {
        let a: Arc<dyn Export> = Arc::new(MemoryExport::new(512));
        let map = ExportMap::new().with("a", a);
        assert!(map.open("").is_none());
    }
}
