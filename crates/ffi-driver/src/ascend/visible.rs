//! `ASCEND_RT_VISIBLE_DEVICES`: the runtime's renumbering of user device ids, read the way the
//! runtime reads it, for a runtime that does not translate ids itself.

/// Where the HAL's logical device id comes from when the runtime does not translate it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum VisibleDevices {
    /// Read `ASCEND_RT_VISIBLE_DEVICES` from the environment.
    #[default]
    FromEnv,
    /// As if the variable were unset: logical id = user id.
    Unset,
    /// This value of the variable.
    Value(String),
}

/// Comma list renumbering the devices the runtime sees (user id i = the i-th entry).
pub const ENV_VISIBLE_DEVICES: &str = "ASCEND_RT_VISIBLE_DEVICES";

/// The logical device id of user device `user` under `ASCEND_RT_VISIBLE_DEVICES = visible`
/// (`None`: unset), read the way the runtime reads it: comma-separated entries, each the number
/// its leading digits spell (what follows them is ignored: "5x" is 5), taken up to the first
/// entry that does not start with a digit (a space included); an entry smaller than the one
/// before or
/// repeating an earlier one makes the whole variable invalid; a variable with no valid entry
/// (set but empty) makes no device visible. The user id indexes the entries taken. (The runtime
/// also stops at an entry past its device count, which only it knows; `aclrtSetDevice` then
/// fails for such an id.)
pub fn logical_device_id(user: u32, visible: Option<&str>) -> Result<u32, String> {
    let Some(list) = visible else {
        return Ok(user);
    };
    let mut ids: Vec<u32> = Vec::new();
    for item in list.split(',') {
        let digits = item.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(id) = item[..digits].parse::<u32>() else {
            break;
        };
        if ids.contains(&id) {
            return Err(format!(
                "{ENV_VISIBLE_DEVICES}={list:?} lists device {id} twice"
            ));
        }
        if ids.last().is_some_and(|&last| id < last) {
            return Err(format!(
                "{ENV_VISIBLE_DEVICES}={list:?} is not in ascending order (the runtime requires it)"
            ));
        }
        ids.push(id);
    }
    if ids.is_empty() {
        return Err(format!(
            "{ENV_VISIBLE_DEVICES}={list:?} makes no device visible (set but empty, or its first \
             entry is not a device id)"
        ));
    }
    usize::try_from(user)
        .ok()
        .and_then(|i| ids.get(i).copied())
        .ok_or_else(|| {
            format!(
                "device {user} is not visible: {ENV_VISIBLE_DEVICES}={list:?} makes {} device(s) \
                 visible ({ids:?})",
                ids.len()
            )
        })
}

impl VisibleDevices {
    /// The variable's value under this setting (`None`: unset).
    pub(crate) fn value(&self) -> Option<String> {
        match self {
            VisibleDevices::FromEnv => std::env::var(ENV_VISIBLE_DEVICES).ok(),
            VisibleDevices::Unset => None,
            VisibleDevices::Value(v) => Some(v.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logical_ids_follow_the_runtimes_rules_for_visible_devices() {
        assert_eq!(logical_device_id(3, None), Ok(3));
        assert_eq!(logical_device_id(0, Some("4,5,6")), Ok(4));
        assert_eq!(logical_device_id(2, Some("4,5,6")), Ok(6));
        // Reading stops at the first entry that does not start with a digit, keeping the ones
        // before it; what follows an entry's digits is ignored.
        assert_eq!(logical_device_id(1, Some("4,5,x,7")), Ok(5));
        assert_eq!(logical_device_id(1, Some("4,5x")), Ok(5));
        assert_eq!(logical_device_id(2, Some("4,5x,6")), Ok(6));
        let e = logical_device_id(2, Some("4,5,x,7")).unwrap_err();
        assert!(e.contains("makes 2 device(s) visible ([4, 5])"), "{e}");
        assert_eq!(
            logical_device_id(0, Some("4, 5")),
            Ok(4),
            "a space ends the list"
        );
        assert!(logical_device_id(1, Some("4, 5")).is_err());
        assert!(logical_device_id(0, Some(" 4")).is_err(), "nothing visible");
        // Descending or repeated: the whole variable is invalid.
        let e = logical_device_id(0, Some("2,5,3")).unwrap_err();
        assert!(e.contains("ascending"), "{e}");
        let e = logical_device_id(0, Some("4,4")).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        // Set but empty: nothing visible.
        let e = logical_device_id(0, Some("")).unwrap_err();
        assert!(e.contains("makes no device visible"), "{e}");
    }
}
