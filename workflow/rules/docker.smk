# The Docker path (config containers.engine: docker): each rule's shell command runs in the
# rule's image through the Docker API, by giving the rule a shell (resource shell_exec) that
# starts its container. Included last by the Snakefile, so it sees every rule.


include: "helpers/docker.smk"


if config["containers"]["engine"] == "docker":
    for docker_rule in workflow.rules:
        if docker_rule.shellcmd:
            docker_rule.resources["shell_exec"] = docker_shell(docker_rule)
