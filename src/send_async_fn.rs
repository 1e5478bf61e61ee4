//! Async closures whose futures are `Send`.

use std::future::Future;

/// An `async` closure whose future is `Send`, written `async move |x| { … }`:
/// the closure given to a module transaction (it receives the
/// [`Tx`](crate::Tx)), and tickbox's own database calls.
///
/// This trait only exists to require, on stable Rust, that the closure's
/// future is `Send` (so the work can run in its own task, where an abandoned
/// caller cannot leave it half done). It is implemented for every such
/// closure; never implement it yourself.
pub trait SendAsyncFn<T, R>:
    AsyncFnOnce(T) -> R + FnOnce(T) -> <Self as SendAsyncFn<T, R>>::Fut
{
    /// The closure's future.
    type Fut: Future<Output = R>;
}

impl<F, T, Fut, R> SendAsyncFn<T, R> for F
where
    F: AsyncFnOnce(T) -> R + FnOnce(T) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}
