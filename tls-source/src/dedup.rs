//! [`Dedup`]: skip bundles whose material has not changed.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::Stream;
use pin_project_lite::pin_project;

use crate::{CertBundle, Digest, Error};

pin_project! {
    /// Skips a bundle whose [`digest`](CertBundle::digest) equals the last one let through.
    ///
    /// An `Err` item is always let through and clears the memory, so that the same good bundle
    /// after an error is let through again: the reload core then records the recovery.
    ///
    /// Made by [`CertSourceExt::dedup`](crate::CertSourceExt::dedup).
    #[must_use = "streams do nothing unless polled"]
    #[derive(Debug)]
    pub struct Dedup<S> {
        #[pin]
        inner: S,
        last: Option<Digest>,
    }
}

impl<S> Dedup<S> {
    /// Wraps the source(s); the same as the `CertSourceExt` method.
    pub fn new(inner: S) -> Self {
        Self { inner, last: None }
    }

    /// The wrapped source.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Stream for Dedup<S>
where
    S: Stream<Item = Result<CertBundle, Error>>,
{
    type Item = Result<CertBundle, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            match ready!(this.inner.as_mut().poll_next(cx)) {
                Some(Ok(bundle)) => {
                    if *this.last == Some(bundle.digest()) {
                        continue;
                    }
                    *this.last = Some(bundle.digest());
                    return Poll::Ready(Some(Ok(bundle)));
                }
                Some(Err(err)) => {
                    *this.last = None;
                    return Poll::Ready(Some(Err(err)));
                }
                None => return Poll::Ready(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::{StreamExt, stream};

    use crate::CertSourceExt;
    use crate::test_support::{bundle, err};

    #[tokio::test]
    async fn skips_repeats_but_not_after_an_error() {
        let (a, b) = (bundle("a.test"), bundle("b.test"));
        let items = vec![
            Ok(a.clone()),
            Ok(a.clone()),
            Ok(b.clone()),
            Ok(b.clone()),
            Err(err("gone")),
            Ok(b.clone()),
        ];
        let out: Vec<_> = stream::iter(items).dedup().collect().await;
        let digests: Vec<_> = out
            .iter()
            .map(|r| {
                r.as_ref()
                    .map(super::super::CertBundle::digest)
                    .map_err(ToString::to_string)
            })
            .collect();
        assert_eq!(
            digests,
            vec![
                Ok(a.digest()),
                Ok(b.digest()),
                Err("test: gone".to_owned()),
                Ok(b.digest())
            ]
        );
    }
}
