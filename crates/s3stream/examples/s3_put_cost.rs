//! The cost of one object-WAL PUT through `S3Storage` (aws-sdk-s3 and hyper), for callgrind:
//! `N` sequential `put_if_absent`s of 256 B to the bucket `BUCKET` on `ENDPOINT`
//! (`s3_put_cost ENDPOINT BUCKET N`); run it with two values of N and divide the difference in
//! instructions by the difference in N. Prints the wall-clock p50 too.

use std::time::Instant;

use bytes::Bytes;
use s3stream::{ObjectStorage, Parts, S3Config, S3Storage};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, endpoint, bucket, n] = &args[..] else {
        return Err("usage: s3_put_cost ENDPOINT BUCKET N".into());
    };
    let n: usize = n.parse()?;
    let mut cfg = S3Config::new(bucket.as_str());
    cfg.endpoint = Some(endpoint.clone());
    cfg.path_style = true;
    cfg.region = Some("us-east-1".into());
    cfg.static_credentials = Some(("testing".into(), "testing".into()));
    let s = S3Storage::connect(&cfg).await;
    let _ = s
        .client()
        .create_bucket()
        .bucket(bucket.as_str())
        .send()
        .await;
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let body = Bytes::from(vec![b'x'; 256]);
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let created = s
            .put_if_absent(&format!("cost/{run}/{i:08}"), Parts::from(body.clone()))
            .await?;
        lat.push(t.elapsed());
        if !created {
            return Err("an entry was already there".into());
        }
    }
    lat.sort();
    println!("{n} puts, p50 {:?}", lat[n / 2]);
    Ok(())
}
