//! The APIs this listener serves and their versions. Only non-flexible versions (plus
//! ApiVersions v3, which every current client tries first, and DescribeCluster, which has no
//! other): they are what the structural pass in [`crate::validate`] walks, and every current
//! client (librdkafka, kafka-python, aiokafka, kafkajs) negotiates them.

use kafka_protocol::messages::ApiKey;

/// (api, min, max).
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 8),
    (ApiKey::Fetch, 4, 11),
    (ApiKey::ListOffsets, 1, 5),
    (ApiKey::Metadata, 0, 8),
    (ApiKey::OffsetCommit, 2, 7),
    (ApiKey::OffsetFetch, 1, 5),
    (ApiKey::FindCoordinator, 0, 2),
    (ApiKey::JoinGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 3),
    (ApiKey::LeaveGroup, 0, 3),
    (ApiKey::SyncGroup, 0, 3),
    (ApiKey::DescribeGroups, 0, 4),
    (ApiKey::ListGroups, 0, 2),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 4),
    (ApiKey::DeleteTopics, 1, 3),
    (ApiKey::InitProducerId, 0, 1),
    (ApiKey::DescribeConfigs, 1, 3),
    (ApiKey::CreatePartitions, 0, 1),
    (ApiKey::DescribeCluster, 0, 2),
];

/// Whether (`key`, `version`) is served.
pub fn supported(key: ApiKey, version: i16) -> bool {
    SUPPORTED
        .iter()
        .any(|&(k, min, max)| k == key && (min..=max).contains(&version))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every advertised version is one the codec decodes, and non-flexible (but ApiVersions
    /// v3 and DescribeCluster), so the structural pass covers it.
    #[test]
    fn advertised_versions_are_decodable_and_walked() {
        for &(k, min, max) in SUPPORTED {
            let range = k.valid_versions();
            assert!(range.min <= min && max <= range.max, "{k:?}");
            for v in min..=max {
                let flexible = k.request_header_version(v) >= 2;
                let walked_flexible =
                    (k == ApiKey::ApiVersions && v >= 3) || k == ApiKey::DescribeCluster;
                assert_eq!(flexible, walked_flexible, "{k:?} v{v}");
            }
        }
    }
}
