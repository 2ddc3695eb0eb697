//! What systemd (or, without a unit, `/proc`) says of nvidia-gridd's unit, as the agent
//! learns it: a value the service, `status` and `diagnose` match on, never a message.

/// How the agent says that nvidia-gridd's unit does not exist.
pub const NOT_INSTALLED: &str = "is not installed";

/// gridd's unit as systemd last answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitState {
    /// Active, reloading or activating.
    Active,
    /// Inactive or failed with a start job queued (its state then): coming back.
    StartQueued(String),
    /// gridd runs without a unit (started by hand, or by a driver container).
    WithoutUnit,
    /// Not running: the unit and its state (`inactive`, `failed`, `deactivating`).
    Stopped { unit: String, state: String },
    /// systemd knows no such unit: it comes with the GRID guest driver, and cannot be
    /// restarted (systemctl answers exit 5).
    NotInstalled { unit: String },
}

impl UnitState {
    /// Whether gridd runs, or is on its way back.
    pub fn running(&self) -> bool {
        !matches!(
            self,
            UnitState::Stopped { .. } | UnitState::NotInstalled { .. }
        )
    }

    /// Why gridd does not run, in one line; `None` while it runs.
    pub fn down(&self) -> Option<String> {
        match self {
            UnitState::Stopped { unit, state } => Some(format!("{unit} is {state}")),
            UnitState::NotInstalled { unit } => Some(format!("{unit} {}", NOT_INSTALLED)),
            _ => None,
        }
    }

    /// The report's word for it (`gridd_unit`): systemd's state of a stopped unit
    /// (`inactive`, `failed`, `deactivating`), else `active`, `start_queued`, `without_unit`
    /// or `not_installed`.
    pub fn as_str(&self) -> &str {
        match self {
            UnitState::Active => "active",
            UnitState::StartQueued(_) => "start_queued",
            UnitState::WithoutUnit => "without_unit",
            UnitState::Stopped { state, .. } => state,
            UnitState::NotInstalled { .. } => "not_installed",
        }
    }

    /// Whether the unit does not exist.
    pub fn missing(&self) -> bool {
        matches!(self, UnitState::NotInstalled { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_stopped_or_missing_unit_is_down_and_says_why() {
        let unit = "nvidia-gridd.service".to_string();
        for up in [
            UnitState::Active,
            UnitState::StartQueued("failed".into()),
            UnitState::WithoutUnit,
        ] {
            assert!(
                up.running() && up.down().is_none() && !up.missing(),
                "{up:?}"
            );
        }
        let stopped = UnitState::Stopped {
            unit: unit.clone(),
            state: "failed".into(),
        };
        assert_eq!(
            stopped.down().as_deref(),
            Some("nvidia-gridd.service is failed")
        );
        assert!(!stopped.running() && !stopped.missing());
        let missing = UnitState::NotInstalled { unit };
        assert_eq!(
            missing.down().as_deref(),
            Some("nvidia-gridd.service is not installed")
        );
        assert!(!missing.running() && missing.missing());
        assert_eq!(
            [
                stopped.as_str(),
                missing.as_str(),
                UnitState::Active.as_str()
            ],
            ["failed", "not_installed", "active"]
        );
    }
}
