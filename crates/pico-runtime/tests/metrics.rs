//! The process recorder behind `/metrics` (its own test binary: one recorder per process).

use std::time::Duration;

/// One sample's value in Prometheus text (`name` with its labels, exactly as rendered).
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The exporter opens a summary's window at the first sample a fold hands it, newest block
/// (64 samples) first, and drops the older samples of that fold from the quantiles. 100
/// samples over two seconds must all reach them: the upkeep folds often enough that no fold
/// holds more than one block (it would have to stall for 1.2 s). With the former 5 s upkeep
/// the quantiles began at the 65th.
#[test]
fn every_sample_of_a_trickle_reaches_the_quantiles() {
    let handle = pico_runtime::metrics_handle().expect("this process installs the recorder");
    let h = metrics::histogram!("pico_test_trickle_seconds");
    const N: u32 = 100;
    for i in 0..N {
        h.record(f64::from(i));
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let text = handle.render();
    let v = |k: &str| value(&text, k).unwrap_or_else(|| panic!("{k} missing:\n{text}"));
    assert_eq!(v("pico_test_trickle_seconds_count"), f64::from(N));
    assert_eq!(
        v("pico_test_trickle_seconds{quantile=\"0\"}"),
        0.0,
        "{text}"
    );
    assert_eq!(
        v("pico_test_trickle_seconds{quantile=\"1\"}"),
        f64::from(N - 1),
        "{text}"
    );
}
