//! Following 307/308 by hand for the bench's reqwest requests, as `pico-client` does.
//!
//! reqwest's own policy re-sends a reusable body on 307, but drops `Authorization` when the
//! redirect changes host or port, which every redirect between two nodes does. With its policy
//! off, each hop is a new request that gets the client's default headers (the token) again.

use bytes::Bytes;
use reqwest::header::{HeaderMap, LOCATION};
use reqwest::{Method, StatusCode, Url};

/// Redirect hops followed (a 307 points at the owner, so one is normal).
const MAX_REDIRECTS: usize = 5;

/// Sends `method url` with `headers` and `body`, following 307/308 to `Location` with the same
/// method, headers and body. A redirect that cannot be followed (no or bad `Location`, too many
/// hops) is returned as the answer, for the caller to report.
pub async fn send(
    http: &reqwest::Client,
    method: Method,
    url: &str,
    headers: HeaderMap,
    body: Option<Bytes>,
) -> Result<reqwest::Response, reqwest::Error> {
    let mut url = url.to_string();
    let mut hops = 0;
    loop {
        let mut req = http.request(method.clone(), &url).headers(headers.clone());
        if let Some(b) = &body {
            req = req.body(b.clone());
        }
        let resp = req.send().await?;
        let status = resp.status();
        if hops == MAX_REDIRECTS
            || !(status == StatusCode::TEMPORARY_REDIRECT
                || status == StatusCode::PERMANENT_REDIRECT)
        {
            return Ok(resp);
        }
        let next = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|loc| Url::parse(&url).ok()?.join(loc).ok());
        let Some(next) = next else {
            return Ok(resp);
        };
        url = next.to_string();
        hops += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::append_conn::tests::one_shot;
    use super::*;

    /// A POST redirected to another port arrives there with its method, body, headers and the
    /// client's default `Authorization` header (which reqwest's own policy would drop).
    #[tokio::test]
    async fn a_307_to_another_node_is_followed_with_body_and_token() {
        let (owner, owner_req) =
            one_shot("HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n".into()).await;
        let (other, other_req) = one_shot(format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://{owner}/s?x=1\r\n\
             content-length: 0\r\nconnection: close\r\n\r\n"
        ))
        .await;
        let mut defaults = HeaderMap::new();
        defaults.insert("authorization", "Bearer t0ken".parse().unwrap());
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .default_headers(defaults)
            .build()
            .unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("content-type", "text/plain".parse().unwrap());
        let resp = send(
            &http,
            Method::POST,
            &format!("http://{other}/s?x=1"),
            headers,
            Some(Bytes::from_static(b"record-body")),
        )
        .await
        .unwrap();
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
        let first = other_req.await.unwrap();
        let second = owner_req.await.unwrap().to_ascii_lowercase();
        assert!(first.starts_with("POST /s?x=1 "), "{first}");
        assert!(second.starts_with("post /s?x=1 "), "{second}");
        assert!(second.contains("authorization: bearer t0ken"), "{second}");
        assert!(second.contains("content-type: text/plain"), "{second}");
        assert!(second.ends_with("record-body"), "{second}");
    }
}
