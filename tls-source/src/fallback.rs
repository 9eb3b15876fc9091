//! [`Fallback`]: serve from a primary source, and from a secondary one until the primary is good.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use pin_project_lite::pin_project;

use crate::{CertBundle, Error};

pin_project! {
    /// Serves from the primary source; until the primary has produced its first good bundle, the
    /// secondary's items are passed on too, so the server has something to serve.
    ///
    /// Once the primary is good, the secondary is dropped (a generator stops generating) and the
    /// primary's later errors are passed on as reports, while the reload core keeps the last good
    /// certificate: a file that is briefly broken during a rotation never sends the server back
    /// to the fallback. The primary is always polled first.
    ///
    /// The typical use: certificate files when they exist, else a self-signed certificate.
    /// Made by [`CertSourceExt::fallback`](crate::CertSourceExt::fallback).
    #[must_use = "streams do nothing unless polled"]
    #[derive(Debug)]
    pub struct Fallback<P, S> {
        #[pin]
        primary: P,
        #[pin]
        secondary: Option<S>,
        primary_done: bool,
    }
}

impl<P, S> Fallback<P, S> {
    /// Wraps the source(s); the same as the `CertSourceExt` method.
    pub fn new(primary: P, secondary: S) -> Self {
        Self {
            primary,
            secondary: Some(secondary),
            primary_done: false,
        }
    }

    /// The primary source, and the secondary one unless it was already dropped.
    pub fn into_inner(self) -> (P, Option<S>) {
        (self.primary, self.secondary)
    }
}

impl<P, S> Stream for Fallback<P, S>
where
    P: Stream<Item = Result<CertBundle, Error>>,
    S: Stream<Item = Result<CertBundle, Error>>,
{
    type Item = Result<CertBundle, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        if !*this.primary_done {
            match this.primary.poll_next(cx) {
                Poll::Ready(Some(Ok(bundle))) => {
                    this.secondary.set(None);
                    return Poll::Ready(Some(Ok(bundle)));
                }
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Some(Err(err))),
                Poll::Ready(None) => *this.primary_done = true,
                Poll::Pending => {}
            }
        }
        if let Some(secondary) = this.secondary.as_mut().as_pin_mut() {
            match secondary.poll_next(cx) {
                Poll::Ready(Some(item)) => return Poll::Ready(Some(item)),
                Poll::Ready(None) => this.secondary.set(None),
                Poll::Pending => {}
            }
        }
        if *this.primary_done && this.secondary.is_none() {
            Poll::Ready(None)
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::{StreamExt, stream};

    use crate::CertSourceExt;
    use crate::test_support::{bundle, err};

    #[tokio::test]
    async fn secondary_serves_until_primary_is_good_then_is_dropped() {
        let (fallback_cert, file_a, file_b) =
            (bundle("self.test"), bundle("a.test"), bundle("b.test"));
        let dropped = Arc::new(AtomicBool::new(false));
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let flag = Flag(dropped.clone());
        let secondary = stream::iter(vec![Ok(fallback_cert.clone())])
            .chain(stream::pending())
            .map(move |item| {
                let _keep = &flag;
                item
            });
        // The primary first reports missing files, is pending while they are missing, then good.
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut out = rx.fallback(secondary);
        tx.unbounded_send(Err(err("missing"))).unwrap();
        assert_eq!(
            out.next().await.unwrap().unwrap_err().to_string(),
            "test: missing"
        );
        assert_eq!(
            out.next().await.unwrap().unwrap().digest(),
            fallback_cert.digest()
        );
        assert!(!dropped.load(Ordering::SeqCst));
        tx.unbounded_send(Ok(file_a.clone())).unwrap();
        assert_eq!(out.next().await.unwrap().unwrap().digest(), file_a.digest());
        assert!(
            dropped.load(Ordering::SeqCst),
            "secondary dropped once primary is good"
        );
        tx.unbounded_send(Err(err("torn"))).unwrap();
        tx.unbounded_send(Ok(file_b.clone())).unwrap();
        drop(tx);
        assert_eq!(
            out.next().await.unwrap().unwrap_err().to_string(),
            "test: torn"
        );
        assert_eq!(out.next().await.unwrap().unwrap().digest(), file_b.digest());
        assert!(out.next().await.is_none());
    }
}
