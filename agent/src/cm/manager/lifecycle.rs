//! Containers through their pod's phases: init containers, then the app containers (started in
//! their cgroups through the backend's join handles, or adopted), termination and shutdown.
use std::time::{Duration, Instant};

use crate::pods::model::{Container, RestartPolicy as PodRestartPolicy};
use crate::runtime::process::{self, Launch};
use crate::runtime::supervisor::{
    ContainerKey, ContainerSpec, ContainerState, Event, RestartPolicy,
};

use super::ContainerManager;
use super::{POD_FINGERPRINT_ENV, Phase, ROOT_OWNER_FILE, container_names, log_event};

impl ContainerManager {
    /// Reaps containers, then advances the pods something happened to (a container event, an
    /// admission, a termination begun, or the reconcile's sweep of every pod): init containers
    /// to the next, terminations to their end. A pod nothing happened to costs nothing.
    pub fn tick(&mut self) {
        for event in self.supervisor.tick(&*self.cgroups) {
            log_event(&event);
            if let Event::Started { key, .. } = &event {
                self.index_started(&key.pod_uid, &key.container);
            }
            self.to_advance.insert(event.key().pod_uid.clone());
        }
        for uid in std::mem::take(&mut self.to_advance) {
            self.advance(&uid);
        }
    }

    /// Stops every container (SIGTERM, SIGKILL after each grace period, at most `within`) and
    /// removes every cgroup this manager created.
    pub fn shutdown(mut self, within: Duration) {
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in &uids {
            self.begin_termination(uid);
        }
        let deadline = Instant::now() + within;
        while !self.supervisor.is_empty() && Instant::now() < deadline {
            for event in self.supervisor.tick(&*self.cgroups) {
                log_event(&event);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for uid in uids {
            self.finish_termination(&uid);
        }
        for tier in [
            self.tiers.burstable.clone(),
            self.tiers.besteffort.clone(),
            self.tiers.kubepods.clone(),
        ] {
            if let Err(e) = self.cgroups.destroy(&tier) {
                tracing::warn!(cgroup = %tier, error = %e, "removing a QoS tier");
            }
        }
        if self.created_root {
            match self.cgroups.destroy(&self.options.root) {
                Ok(_) => {
                    if let Some(dir) = &self.options.state_dir {
                        let _ = std::fs::remove_file(dir.join(ROOT_OWNER_FILE));
                    }
                }
                Err(e) => {
                    tracing::warn!(cgroup = %self.options.root, error = %e, "removing the cgroup root");
                }
            }
        }
        self.resources.flush();
        tracing::info!("container manager stopped; its cgroups are removed");
    }

    /// Starts or restarts what the pod's phase calls for.
    pub(super) fn advance(&mut self, uid: &str) {
        let Some(managed) = self.pods.get(uid) else {
            return;
        };
        match managed.phase {
            Phase::Initializing(i) => {
                let Some(init) = managed.pod.spec.init_containers.get(i).cloned() else {
                    self.set_phase(uid, Phase::Running);
                    self.advance(uid);
                    return;
                };
                let key = self.key(uid, &init.name);
                match self.supervisor.state(&key) {
                    None => self.launch(uid, &init, true),
                    Some(ContainerState::Terminated { exit_code: 0 }) => {
                        self.set_phase(uid, Phase::Initializing(i + 1));
                        self.advance(uid);
                    }
                    Some(_) => {}
                }
            }
            Phase::Running => {
                let containers = managed.pod.spec.containers.clone();
                for container in &containers {
                    if self
                        .supervisor
                        .state(&self.key(uid, &container.name))
                        .is_none()
                    {
                        self.launch(uid, container, false);
                    }
                }
            }
            Phase::Terminating => {
                let names = container_names(&managed.pod);
                if names
                    .iter()
                    .all(|n| self.supervisor.state(&self.key(uid, n)).is_none())
                {
                    self.finish_termination(uid);
                    if let Some(next) = self.pending.remove(uid) {
                        self.admit(next);
                    }
                }
            }
        }
    }

    pub(super) fn set_phase(&mut self, uid: &str, phase: Phase) {
        if let Some(managed) = self.pods.get_mut(uid) {
            managed.phase = phase;
        }
    }

    pub(super) fn key(&self, uid: &str, container: &str) -> ContainerKey {
        ContainerKey {
            pod_uid: uid.to_owned(),
            container: container.to_owned(),
        }
    }

    pub(super) fn launch(&mut self, uid: &str, container: &Container, init: bool) {
        let Some(managed) = self.pods.get(uid) else {
            return;
        };
        let Ok(cgroup) = self.cgroups.container(&managed.cgroup, &container.name) else {
            return;
        };
        let restart_policy = match (init, managed.pod.spec.restart_policy) {
            (_, PodRestartPolicy::Never) => RestartPolicy::Never,
            (true, _) | (false, PodRestartPolicy::OnFailure) => RestartPolicy::OnFailure,
            (false, PodRestartPolicy::Always) => RestartPolicy::Always,
        };
        let log_file = self.options.log_dir.as_ref().map(|dir| {
            dir.join(format!(
                "{}_{}_{uid}",
                managed.pod.metadata.namespace, managed.pod.metadata.name
            ))
            .join(format!("{}.log", container.name))
        });
        let spec = ContainerSpec {
            launch: Launch {
                argv: container
                    .command
                    .iter()
                    .chain(container.args.iter())
                    .cloned()
                    .collect(),
                // The pod's fingerprint last, over any variable of the same name.
                env: container
                    .env
                    .iter()
                    .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
                    .chain([(POD_FINGERPRINT_ENV.to_owned(), managed.pod.fingerprint())])
                    .collect(),
                log_file,
            },
            cgroup: cgroup.clone(),
            restart_policy,
            grace: Duration::from_secs(
                u64::try_from(managed.pod.spec.termination_grace_period_seconds).unwrap_or(0),
            ),
        };
        let key = self.key(uid, &container.name);
        if self.adoptable.remove(&key)
            && let Some(pid) = self
                .cgroups
                .pids(&cgroup)
                .ok()
                .and_then(|pids| process::group_leader(&pids))
        {
            match self.supervisor.adopt(&key, &spec, pid) {
                Some(Ok(event)) => {
                    log_event(&event);
                    return;
                }
                Some(Err(e)) => {
                    tracing::warn!(pod_uid = %uid, container = %container.name, error = %e, "cannot adopt the running process; starting the container again");
                }
                None => return,
            }
        }
        if let Some(event) = self.supervisor.ensure(&key, &spec, &*self.cgroups) {
            log_event(&event);
            if matches!(event, Event::Started { .. }) {
                self.index_started(uid, &container.name);
            }
        }
    }

    pub(super) fn begin_termination(&mut self, uid: &str) {
        let Some(managed) = self.pods.get_mut(uid) else {
            return;
        };
        managed.phase = Phase::Terminating;
        self.to_advance.insert(uid.to_owned());
        let names = container_names(&managed.pod);
        for name in names {
            let key = self.key(uid, &name);
            self.supervisor.stop(&key);
        }
        self.refresh_tiers();
        self.publish_pod_counts();
    }

    /// Removes the pod's cgroups (containers are stopped by now) and forgets it.
    pub(super) fn finish_termination(&mut self, uid: &str) {
        let Some(managed) = self.pods.remove(uid) else {
            return;
        };
        if let Err(e) = self.cgroups.destroy(&managed.cgroup) {
            tracing::warn!(pod = %managed.pod.full_name(), error = %e, "removing pod cgroups");
            self.count_error(&e);
        }
        self.index
            .remove_pod(&managed.pod.metadata.namespace, &managed.pod.metadata.name);
        self.ids
            .retain(|name, _| !name.starts_with(&managed.cgroup));
        self.resources.release(uid);
        tracing::info!(pod = %managed.pod.full_name(), "pod stopped and its cgroups removed");
        self.refresh_shared_pool();
        self.refresh_tiers();
        self.publish_pod_counts();
    }
}
