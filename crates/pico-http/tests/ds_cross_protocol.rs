//! One stream, two protocols: a stream written over Durable Streams reads over Pico at the same
//! record offsets, byte for byte (binary bodies included), and vice versa.

mod common;

use axum::body::Body;
use common::*;
use pico_protocol::{decode_binary, format_offset};

fn binary_body(i: u8) -> Vec<u8> {
    // Every byte value, NULs, CR/LF and invalid UTF-8 included.
    (0..=255u8)
        .map(|b| b.wrapping_add(i))
        .chain([0, b'\r', b'\n', 0xff])
        .collect()
}

#[tokio::test]
async fn ds_writes_read_over_pico_byte_for_byte() {
    let (app, _) = app().await;
    let bodies: Vec<Vec<u8>> = (0..3).map(binary_body).collect();
    let r = put(
        &app,
        "/v1/stream/x/bin",
        &[("content-type", "application/octet-stream")],
        bodies[0].clone(),
    )
    .await;
    assert_eq!(r.code(), 201);
    for b in &bodies[1..] {
        post(
            &app,
            "/v1/stream/x/bin",
            &[("content-type", "application/octet-stream")],
            b.clone(),
        )
        .await;
    }
    // The DS tail is the Pico next seq, in text form.
    let pico_head = head(&app, "/x/bin").await;
    assert_eq!(pico_head.h("pico-next-seq"), Some("3"));
    assert_eq!(
        head(&app, "/v1/stream/x/bin").await.offset(),
        format_offset(3)
    );

    // Pico binary framing: one record per DS append, at offsets 0, 1, 2.
    let r = get(&app, "/x/bin?format=binary").await;
    let records = decode_binary(&r.body).unwrap();
    assert_eq!(records.len(), 3);
    for (i, (offset, rec)) in records.iter().enumerate() {
        assert_eq!(*offset, i as u64);
        assert_eq!(rec.value.to_vec(), bodies[i]);
    }
    // Raw Pico read from a DS-minted offset equals the DS read from it.
    let from = format_offset(1);
    let ds = get(&app, &format!("/v1/stream/x/bin?offset={from}")).await;
    let pico = get(&app, "/x/bin?seq=1&format=raw").await;
    assert_eq!(ds.body, pico.body);
    assert_eq!(
        ds.body.to_vec(),
        [bodies[1].clone(), bodies[2].clone()].concat()
    );
}

#[tokio::test]
async fn pico_writes_read_over_ds_byte_for_byte() {
    let (app, _) = app().await;
    let r = put(
        &app,
        "/orders",
        &[("content-type", "application/octet-stream")],
        Body::empty(),
    )
    .await;
    assert_eq!(r.code(), 201);
    let bodies: Vec<Vec<u8>> = (10..14).map(binary_body).collect();
    for b in &bodies {
        let r = post(
            &app,
            "/orders",
            &[("content-type", "application/octet-stream")],
            b.clone(),
        )
        .await;
        assert_eq!(r.code(), 200);
    }
    let all = get(&app, "/v1/stream/orders").await;
    assert_eq!(all.code(), 200);
    assert_eq!(all.body.to_vec(), bodies.concat());
    assert_eq!(all.offset(), format_offset(4));
    // DS offsets address the same records as Pico seqs.
    for seq in 0..4u64 {
        let ds = get(
            &app,
            &format!("/v1/stream/orders?offset={}", format_offset(seq)),
        )
        .await;
        assert_eq!(
            ds.body.to_vec(),
            bodies[seq as usize..].concat(),
            "seq {seq}"
        );
    }
    // A DS append continues the Pico stream.
    let r = post(
        &app,
        "/v1/stream/orders",
        &[("content-type", "application/octet-stream")],
        vec![7u8, 0, 7],
    )
    .await;
    assert_eq!((r.code(), r.offset()), (204, format_offset(5)));
    let r = get(&app, "/orders?seq=4&format=raw").await;
    assert_eq!(r.body.to_vec(), vec![7u8, 0, 7]);
}

#[tokio::test]
async fn json_messages_are_pico_records() {
    let (app, _) = app().await;
    put(
        &app,
        "/v1/stream/events",
        &[("content-type", "application/json")],
        r#"[{"n":1},{"n":2}]"#,
    )
    .await;
    // Each DS JSON message is one Pico record holding the message's bytes.
    let r = get(&app, "/events?format=binary").await;
    let records = decode_binary(&r.body).unwrap();
    let values: Vec<&[u8]> = records.iter().map(|(_, r)| &r.value[..]).collect();
    assert_eq!(values, vec![&br#"{"n":1}"#[..], br#"{"n":2}"#]);
    // A Pico append of one JSON value reads back in the DS array.
    post(
        &app,
        "/events",
        &[("content-type", "application/json")],
        r#"{"n":3}"#,
    )
    .await;
    let r = get(&app, "/v1/stream/events").await;
    assert_eq!(r.json(), serde_json::json!([{"n":1},{"n":2},{"n":3}]));
}
