//! What a panic said and where it happened, for tests of the test kit's
//! own failure messages.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// The text of a panic's payload.
pub fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => payload
            .downcast::<&str>()
            .map(|text| text.to_string())
            .unwrap_or_else(|_| "a panic without text".to_string()),
    }
}

/// Runs `f`, which must panic, and returns where it panicked
/// (`file:line:column`) and its message. The panic hook is process-wide:
/// while `f` runs, panics on other threads go to the hook that was there.
pub fn panic_location(f: impl FnOnce()) -> (String, String) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let this_thread = std::thread::current().id();
    let seen: Arc<Mutex<Option<String>>> = Arc::default();
    let earlier = Arc::new(panic::take_hook());
    let hook_earlier = earlier.clone();
    let hook_seen = seen.clone();
    panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() == this_thread {
            let at = info.location().map(|l| l.to_string()).unwrap_or_default();
            *hook_seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
        } else {
            hook_earlier(info);
        }
    }));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    // Put the earlier hook back (ours holds a clone of it: unwrap the Arc
    // once ours is gone).
    drop(panic::take_hook());
    let earlier = Arc::try_unwrap(earlier).unwrap_or_else(|_| unreachable!("our hook is dropped"));
    panic::set_hook(earlier);
    let payload = result.expect_err("the closure panics");
    let at = seen.lock().unwrap_or_else(|p| p.into_inner()).take();
    (at.expect("the hook saw the panic"), panic_message(payload))
}
