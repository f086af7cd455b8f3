"""Run the Pulumi program under Pulumi's mocks (``pulumi.runtime.set_mocks``): no CLI, no cloud.

:func:`deploy` declares the whole stack for a configuration, the way ``pulumi up`` would,
with :class:`CloudMocks` standing in for the AWS and random providers: each resource's
outputs are its inputs plus the attributes AWS would compute (ids, ARNs, endpoints,
generated passwords), shaped as the providers document them. What comes back is every
resource with its inputs, and the stack's outputs resolved.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime.mocks import MockMonitor

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"

ACCOUNT = "123456789012"
REGION = "eu-west-1"
ZONES = ["eu-west-1a", "eu-west-1b", "eu-west-1c"]

SECRET_SIG = "4dabf18193072939515e22adb298388d"
"""The key marking a secret value in Pulumi's wire format (``{SIG: SECRET, "value": v}``)."""
SECRET = "1b47061264138c4ac30d75fd1eb44270"


def is_secret_wrapper(value: Any) -> bool:
    """Whether ``value`` is a secret as Pulumi passes it (the engine encrypts those)."""
    return isinstance(value, dict) and value.get(SECRET_SIG) == SECRET


def unwrap(value: Any) -> Any:
    """``value`` with every secret wrapper replaced by its plain value (as policies see it)."""
    if is_secret_wrapper(value):
        return unwrap(value["value"])
    if isinstance(value, dict):
        return {key: unwrap(item) for key, item in value.items()}
    if isinstance(value, list):
        return [unwrap(item) for item in value]
    return value


@dataclass
class Registered:
    """One resource the program declared: its type token, logical name, inputs (camelCase,
    numbers as floats, secrets wrapped) and the outputs the mock gave it."""

    typ: str
    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    urn: str = ""
    protect: bool = False
    dependencies: frozenset[str] = frozenset()
    """The URNs this resource waits for: its ``depends_on`` (a component's children) and
    the resources whose outputs are among its inputs."""

    @property
    def props(self) -> dict[str, Any]:
        """The inputs with secrets unwrapped: what a policy pack sees."""
        props: dict[str, Any] = unwrap(self.inputs)
        return props


@dataclass
class Deployment:
    """A stack declared under the mocks: every resource, and the outputs resolved."""

    resources: list[Registered]
    outputs: dict[str, Any]
    secret_outputs: set[str]
    generated_secrets: list[str] = field(default_factory=list)

    def of_type(self, typ: str) -> list[Registered]:
        """The resources of type token ``typ`` (``aws:ecs/service:Service``)."""
        return [r for r in self.resources if r.typ == typ]

    def one(self, typ: str) -> Registered:
        """The only resource of type ``typ``; AssertionError if there are none or several."""
        [found] = self.of_type(typ)
        return found

    def named(self, typ: str, name: str) -> Registered:
        """The resource of type ``typ`` with logical name ``name``."""
        [found] = [r for r in self.of_type(typ) if r.name == name]
        return found

    def by_id(self) -> dict[str, Registered]:
        """Resources by the id the mock gave them."""
        return {str(r.outputs["__id"]): r for r in self.resources}


class RecordingMonitor(MockMonitor):
    """Pulumi's mock monitor, also keeping what the engine alone sees of each resource:
    its URN, ``protect`` and dependencies (``MockResourceArgs`` carries neither), by
    (type, logical name). Registrations may come from several threads at once."""

    def __init__(self, mocks: CloudMocks) -> None:
        super().__init__(mocks)
        self.options: dict[tuple[str, str], tuple[str, bool, frozenset[str]]] = {}

    def RegisterResource(self, request: Any) -> Any:
        urn = self.make_urn(request.parent, request.type, request.name)
        self.options[(request.type, request.name)] = (
            urn,
            bool(request.protect),
            frozenset(request.dependencies),
        )
        return super().RegisterResource(request)

    def annotate(self, resources: list[Registered]) -> None:
        """Give each of ``resources`` its URN, ``protect`` and dependencies."""
        for resource in resources:
            resource.urn, resource.protect, resource.dependencies = self.options[
                (resource.typ, resource.name)
            ]


def _secret(value: Any) -> dict[str, Any]:
    return {SECRET_SIG: SECRET, "value": value}


class CloudMocks(pulumi.runtime.Mocks):
    """The AWS and random providers, answering as the real ones would shape their answers."""

    def __init__(self) -> None:
        self.resources: list[Registered] = []
        self.generated_secrets: list[str] = []
        self._count = 0

    def _arn(self, service: str, resource: str) -> str:
        return f"arn:aws:{service}:{REGION}:{ACCOUNT}:{resource}"

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self._count += 1
        inputs = dict(args.inputs)
        outputs = dict(inputs)
        typ, name = args.typ, args.name
        physical = inputs.get("name") or f"{name}-{self._count:07d}"
        resource_id = f"{name}-id"
        module = typ.split(":")[1].split("/")[0] if ":" in typ else ""
        outputs.setdefault("arn", self._arn(module, f"{module}/{physical}"))
        if typ == "random:index/randomPassword:RandomPassword":
            value = f"generated-secret-{self._count:04d}-{'x' * 20}"
            self.generated_secrets.append(value)
            # The provider's schema marks `result` secret; the engine keeps it encrypted.
            outputs["result"] = _secret(value)
        elif typ == "aws:msk/cluster:Cluster":
            cluster = inputs["clusterName"]
            outputs["arn"] = self._arn(
                "kafka", f"cluster/{cluster}/0a1b2c3d-1111-2222-3333-444455556666-3"
            )
            brokers = int(inputs["numberOfBrokerNodes"])
            outputs["bootstrapBrokersSaslScram"] = ",".join(
                f"b-{i}.{cluster}.abc123.c3.kafka.{REGION}.amazonaws.com:9096"
                for i in range(1, brokers + 1)
            )
        elif typ == "aws:msk/serverlessCluster:ServerlessCluster":
            cluster = inputs["clusterName"]
            outputs["arn"] = self._arn(
                "kafka", f"cluster/{cluster}/0a1b2c3d-7777-8888-9999-000011112222-s1"
            )
            outputs["bootstrapBrokersSaslIam"] = (
                f"boot-abc123.c1.kafka-serverless.{REGION}.amazonaws.com:9098"
            )
        elif typ == "aws:msk/configuration:Configuration":
            outputs["latestRevision"] = 1
        elif typ == "aws:secretsmanager/secret:Secret":
            prefix = inputs.get("namePrefix", name)
            outputs["arn"] = self._arn("secretsmanager", f"secret:{prefix}{self._count:04d}-AbCdEf")
        elif typ == "aws:elasticache/replicationGroup:ReplicationGroup":
            group = inputs["replicationGroupId"]
            outputs["primaryEndpointAddress"] = f"master.{group}.abc123.euw1.cache.amazonaws.com"
        elif typ == "aws:rds/instance:Instance":
            identifier = (
                inputs.get("identifier") or f"{inputs['identifierPrefix']}{self._count:07d}"
            )
            outputs["identifier"] = identifier
            outputs["address"] = f"{identifier}.abc123.{REGION}.rds.amazonaws.com"
            outputs["masterUserSecrets"] = [
                {
                    "secretArn": self._arn(
                        "secretsmanager", f"secret:rds!db-{self._count:04d}-XyZ123"
                    ),
                    "secretStatus": "active",
                    "kmsKeyId": self._arn("kms", "key/aws-secretsmanager"),
                }
            ]
        elif typ == "aws:lb/loadBalancer:LoadBalancer":
            outputs["dnsName"] = f"{physical}-0123456789abcdef.elb.{REGION}.amazonaws.com"
            outputs["arnSuffix"] = f"net/{physical}/0123456789abcdef"
            outputs["arn"] = self._arn(
                "elasticloadbalancing", f"loadbalancer/{outputs['arnSuffix']}"
            )
        elif typ == "aws:lb/targetGroup:TargetGroup":
            outputs["arnSuffix"] = f"targetgroup/{physical}/fedcba9876543210"
            outputs["arn"] = self._arn("elasticloadbalancing", outputs["arnSuffix"])
        elif typ == "aws:s3/bucket:Bucket":
            bucket = f"{inputs['bucketPrefix']}{self._count:07d}"
            outputs["bucket"] = bucket
            outputs["arn"] = f"arn:aws:s3:::{bucket}"
            resource_id = bucket
        elif typ == "aws:iam/role:Role":
            outputs["arn"] = f"arn:aws:iam::{ACCOUNT}:role/{physical}"
        elif typ == "aws:ecr/repository:Repository":
            outputs["repositoryUrl"] = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{physical}"
            outputs["arn"] = self._arn("ecr", f"repository/{physical}")
        elif typ == "aws:emrserverless/application:Application":
            resource_id = f"00f{self._count:013d}"
            outputs["arn"] = self._arn("emr-serverless", f"/applications/{resource_id}")
        elif typ == "aws:ecs/taskDefinition:TaskDefinition":
            outputs["arn"] = self._arn("ecs", f"task-definition/{inputs['family']}:1")
        elif typ == "aws:cloudwatch/logGroup:LogGroup":
            outputs["arn"] = self._arn("logs", f"log-group:{physical}")
        outputs.setdefault("name", physical)
        self.resources.append(Registered(typ, name, inputs, {**outputs, "__id": resource_id}))
        return resource_id, outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "aws:index/getAvailabilityZones:getAvailabilityZones":
            return {"id": REGION, "names": ZONES, "zoneIds": ["euw1-az1", "euw1-az2", "euw1-az3"]}
        if args.token == "aws:index/getRegion:getRegion":
            return {"id": REGION, "region": REGION, "name": REGION}
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "id": ACCOUNT,
                "accountId": ACCOUNT,
                "arn": f"arn:aws:iam::{ACCOUNT}:user/deployer",
                "userId": "AIDAEXAMPLE",
            }
        raise NotImplementedError(f"no mock for invoke {args.token}")


def stack_file_values(stack: str) -> dict[str, Any]:
    """The ``config:`` mapping of ``infra/Pulumi.<stack>.yaml``."""
    document = yaml.safe_load((INFRA / f"Pulumi.{stack}.yaml").read_text(encoding="utf-8"))
    values: dict[str, Any] = document["config"]
    return values


def as_pulumi_config(values: Mapping[str, Any]) -> dict[str, str]:
    """Stack file values as the engine hands them to a program: text, JSON for the rest."""
    return {
        key: value if isinstance(value, str) else json.dumps(value) for key, value in values.items()
    }


def deploy(stack: str, values: Mapping[str, Any]) -> Deployment:
    """Declare the whole stack ``stack`` with configuration ``values`` (``cormorant:key`` →
    value, as in a stack file) under :class:`CloudMocks`; return what was declared.

    Runs in a thread of its own with its own event loop (Pulumi's runtime drives one), so
    the test session's asyncio loop is left alone. Raises whatever the program raises
    (``ConfigError`` for a bad value).
    """
    outcome: list[Deployment] = []
    errors: list[BaseException] = []

    def run() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            outcome.append(_declare(stack, values))
        except BaseException as exc:
            errors.append(exc)
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    worker = threading.Thread(target=run, name=f"pulumi-mocks-{stack}")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    return outcome[0]


def _declare(stack: str, values: Mapping[str, Any]) -> Deployment:
    from cormorant_infra.config import load
    from cormorant_infra.stack import build

    mocks = CloudMocks()
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(
        mocks, project="cormorant", stack=stack, preview=False, monitor=monitor
    )
    pulumi.runtime.set_all_config(as_pulumi_config(values))
    resolved: dict[str, Any] = {}
    secret_outputs: set[str] = set()

    @pulumi.runtime.test  # type: ignore[misc]
    def declare() -> pulumi.Output[None]:
        outputs = build(load())

        def keep(name: str) -> Any:
            output = pulumi.Output.from_input(outputs[name])

            def store(args: list[Any]) -> None:
                value, secret = args
                resolved[name] = value
                if secret:
                    secret_outputs.add(name)

            return pulumi.Output.all(output, output.is_secret()).apply(store)

        return pulumi.Output.all(*[keep(name) for name in outputs]).apply(lambda _: None)

    declare()
    monitor.annotate(mocks.resources)
    return Deployment(mocks.resources, resolved, secret_outputs, mocks.generated_secrets)


def walk(value: Any) -> Iterator[Any]:
    """Every value nested in ``value`` (dicts and lists), ``value`` included."""
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)
