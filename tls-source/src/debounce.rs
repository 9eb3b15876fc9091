//! [`Debounce`]: wait for a quiet period, then pass on the latest item.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

pin_project! {
    /// Holds each item until the inner stream has been quiet for the given period, then yields
    /// only the latest one (latest wins: earlier items of a burst are dropped, `Err`s included).
    ///
    /// When the inner stream ends, a held item is yielded at once, then the stream ends.
    /// A stream that never pauses for the quiet period yields nothing until it does.
    ///
    /// Made by [`CertSourceExt::debounce`](crate::CertSourceExt::debounce). Needs a Tokio runtime
    /// with the timer enabled.
    #[must_use = "streams do nothing unless polled"]
    #[derive(Debug)]
    pub struct Debounce<S: Stream> {
        #[pin]
        inner: S,
        quiet: Duration,
        held: Option<S::Item>,
        sleep: Option<Pin<Box<Sleep>>>,
        done: bool,
    }
}

impl<S: Stream> Debounce<S> {
    /// Wraps the source(s); the same as the `CertSourceExt` method.
    pub fn new(inner: S, quiet: Duration) -> Self {
        Self {
            inner,
            quiet,
            held: None,
            sleep: None,
            done: false,
        }
    }

    /// The wrapped source; an item held for the quiet period is dropped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Stream> Stream for Debounce<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut this = self.project();
        while !*this.done {
            match this.inner.as_mut().poll_next(cx) {
                Poll::Ready(Some(item)) => {
                    *this.held = Some(item);
                    let deadline = Instant::now() + *this.quiet;
                    match this.sleep {
                        Some(sleep) => sleep.as_mut().reset(deadline),
                        None => *this.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
                    }
                }
                Poll::Ready(None) => *this.done = true,
                Poll::Pending => break,
            }
        }
        if this.held.is_some() {
            let quiet_enough = match this.sleep {
                Some(sleep) => sleep.as_mut().poll(cx).is_ready(),
                None => true,
            };
            if *this.done || quiet_enough {
                return Poll::Ready(this.held.take());
            }
            return Poll::Pending;
        }
        if *this.done {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use crate::CertSourceExt;
    use crate::test_support::bundle;

    #[tokio::test(start_paused = true)]
    async fn yields_only_the_latest_of_a_burst() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut out = rx.debounce(Duration::from_millis(100));
        let (a, b, c) = (bundle("a.test"), bundle("b.test"), bundle("c.test"));
        tx.unbounded_send(Ok(a)).unwrap();
        tx.unbounded_send(Ok(b.clone())).unwrap();
        // Nothing comes out while the quiet period has not passed.
        let early = tokio::time::timeout(Duration::from_millis(50), out.next()).await;
        assert!(early.is_err());
        let got = out.next().await.unwrap().unwrap();
        assert_eq!(got.digest(), b.digest());
        tx.unbounded_send(Ok(c.clone())).unwrap();
        drop(tx);
        // The end of the stream flushes what is held.
        assert_eq!(out.next().await.unwrap().unwrap().digest(), c.digest());
        assert!(out.next().await.is_none());
    }
}
