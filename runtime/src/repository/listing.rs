//! Listing a prefix of an object store past the keys `object_store` cannot
//! name. Its `Path` refuses a key with an empty (`//`), `.` or `..`
//! segment, and one such key fails the whole page of up to 1,000 keys it
//! came in, so one stray object would hide every model. Such a key can
//! never be a model file (the mirror could not place it), so it is
//! skipped: [`list`] lists as usual and, only when a page fails on such a
//! key, lists again page by page, halving a failing page down to the one
//! key that fails it, which is then passed over (the stores' `start-after`
//! offset takes any key as it is).

use std::collections::BTreeSet;

use futures_util::stream::TryStreamExt;
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::{ObjectMeta, ObjectStore};
use parking_lot::Mutex;

/// A store's client: its objects and its paginated listing.
pub(super) trait Client: ObjectStore + PaginatedListStore {}

impl<T: ObjectStore + PaginatedListStore> Client for T {}

/// Keys the stores return in one page at most (S3's and GCS's 1,000,
/// Azure's 5,000).
const PAGE: usize = 1000;

/// Requests one listing makes at most while it passes bad keys over.
const MAX_REQUESTS: usize = 10_000;

/// Every object under `prefix` (a key prefix without its trailing `/`;
/// `None` for the whole store) whose key `object_store` can name; each key
/// skipped is logged once per `warned` set.
///
/// # Errors
/// The store's error for anything but an unnameable key; a store that
/// ignores offsets (the Azurite emulator) or a listing past
/// [`MAX_REQUESTS`] fails with the error of the first bad page.
pub(super) async fn list(
    store: &dyn Client,
    prefix: Option<&object_store::path::Path>,
    warned: &Mutex<BTreeSet<String>>,
) -> Result<Vec<ObjectMeta>, object_store::Error> {
    let first = match store.list(prefix).try_collect().await {
        Ok(metas) => return Ok(metas),
        Err(e) if unnameable(&e).is_some() => e,
        Err(e) => return Err(e),
    };
    let prefix = prefix.map(|p| format!("{}/", p.as_ref()));
    let mut metas = Vec::new();
    let mut offset: Option<String> = None;
    let mut page = PAGE;
    for _ in 0..MAX_REQUESTS {
        let options = PaginatedListOptions { offset: offset.clone(), max_keys: Some(page), ..Default::default() };
        match store.list_paginated(prefix.as_deref(), options).await {
            Ok(listed) => {
                let objects = listed.result.objects;
                let last = objects.last().map(|o| o.location.to_string());
                if listed.page_token.is_none() || last.is_none() {
                    metas.extend(objects);
                    return Ok(metas);
                }
                if last <= offset {
                    // The store listed from the start again: it takes no offset.
                    return Err(first);
                }
                metas.extend(objects);
                (offset, page) = (last, PAGE);
            }
            Err(e) => match unnameable(&e) {
                Some(key) if page == 1 => {
                    if warned.lock().insert(key.to_owned()) {
                        tracing::warn!(
                            key,
                            "skipping the object '{key}': a key with an empty, '.' or '..' segment can be no model file"
                        );
                    }
                    (offset, page) = (Some(key.to_owned()), PAGE);
                }
                Some(_) => page /= 2,
                None => return Err(e),
            },
        }
    }
    Err(first)
}

/// The key an error says `object_store` cannot name, if that is what it is.
fn unnameable(e: &object_store::Error) -> Option<&str> {
    use object_store::path::Error as P;
    match e {
        object_store::Error::InvalidPath { source: P::EmptySegment { path } | P::BadSegment { path, .. } } => {
            Some(path)
        }
        _ => None,
    }
}
