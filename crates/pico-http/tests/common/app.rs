//! The one bound tests send requests through: the protocol service (`fast::Protocol`) or an
//! axum router (admin), alike.

/// What a test sends requests to: the protocol service, or the admin router.
pub trait App:
    tower::Service<
        axum::http::Request<axum::body::Body>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future: Send,
    > + Clone
{
}

impl<S> App for S where
    S: tower::Service<
            axum::http::Request<axum::body::Body>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
            Future: Send,
        > + Clone
{
}
