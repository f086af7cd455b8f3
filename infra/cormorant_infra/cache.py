"""The message store of persistent DEVICE sessions: an ElastiCache Redis replication group.

Two or more nodes, each in another availability zone (round robin over the stack's zones),
with automatic failover (Multi-AZ), encrypted at rest and in transit, clients authenticated
with an AUTH token kept in Secrets Manager. A production stack has three nodes (a primary and
two replicas, :class:`~cormorant_infra.config.StackConfig`): device_persist counts a write
done once one replica has it (Redis ``WAIT``, :func:`wait_replicas`), and after a failover
the promoted node still has a replica to confirm its writes; with one replica, writes would
wait until ElastiCache has replaced the failed node (docs/guarantees/production-failover.md).
Redis
must never evict a stored message to make room: ``maxmemory-policy noeviction`` makes a
full Redis refuse writes instead (device_persist retries them), where ElastiCache's default
policy would silently drop messages that were acknowledged to their publishers.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_random as random

from cormorant_infra.config import StackConfig
from cormorant_infra.network import REDIS_PORT, Network

ENGINE_VERSION = "7.1"
PARAMETER_FAMILY = "redis7"


def wait_replicas(nodes: int) -> int:
    """Replicas that must confirm each store write (device_persist's ``redis_wait_replicas``)
    in a replication group of ``nodes`` nodes: 1 with two replicas or more, so that a write
    is on two nodes before its Kafka offset is committed and a failover still leaves a
    replica to confirm the next; 0 with one replica (a failover would stop every write
    until the failed node is replaced)."""
    return 1 if nodes >= 3 else 0


def node_zones(zones: list[str], nodes: int) -> list[str]:
    """The availability zone of each of ``nodes`` nodes: the stack's ``zones`` in turn, so
    that a zone's loss takes at most ``ceil(nodes / len(zones))`` of them (the first is the
    primary's preferred zone)."""
    return [zones[index % len(zones)] for index in range(nodes)]


class Cache(pulumi.ComponentResource):
    """The Redis replication group.

    Attributes: ``url`` (``rediss://<primary endpoint>:6379/0``), ``replication_group_id``,
    ``member_ids`` (its cache clusters, for alarms), ``auth_secret_arn`` (the AUTH token's
    secret: a plain string), ``wait_replicas`` (:func:`wait_replicas` of its node count).
    """

    def __init__(
        self,
        name: str,
        config: StackConfig,
        network: Network,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("cormorant:cache:Cache", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        token = random.RandomPassword(
            # ElastiCache AUTH tokens: 16-128 printable characters without @ " or /.
            f"{name}-auth-token",
            length=64,
            special=False,
            opts=child,
        )
        secret = aws.secretsmanager.Secret(
            f"{name}-auth-token",
            name_prefix=f"{name}-redis-auth-",
            description="Cormorant's Redis AUTH token",
            opts=child,
        )
        aws.secretsmanager.SecretVersion(
            f"{name}-auth-token", secret_id=secret.id, secret_string=token.result, opts=child
        )
        subnets = aws.elasticache.SubnetGroup(
            f"{name}-subnets", subnet_ids=network.private_subnet_ids, opts=child
        )
        parameters = aws.elasticache.ParameterGroup(
            f"{name}-params",
            family=PARAMETER_FAMILY,
            parameters=[{"name": "maxmemory-policy", "value": "noeviction"}],
            opts=child,
        )
        self.replication_group_id = f"{name}"[:40]
        group = aws.elasticache.ReplicationGroup(
            f"{name}-redis",
            replication_group_id=self.replication_group_id,
            description="Cormorant message store",
            engine="redis",
            engine_version=ENGINE_VERSION,
            node_type=config.redis_node_type,
            num_cache_clusters=config.redis_nodes,
            preferred_cache_cluster_azs=node_zones(network.zones, config.redis_nodes),
            automatic_failover_enabled=True,
            multi_az_enabled=True,
            at_rest_encryption_enabled=True,
            transit_encryption_enabled=True,
            auth_token=token.result,
            port=REDIS_PORT,
            parameter_group_name=parameters.name,
            subnet_group_name=subnets.name,
            security_group_ids=[network.security_groups["cache"]],
            snapshot_retention_limit=config.redis_snapshot_retention_days,
            auto_minor_version_upgrade=True,
            apply_immediately=False,
            opts=pulumi.ResourceOptions(parent=self, protect=config.production),
        )
        # ElastiCache names a replication group's clusters <group id>-001, -002, ...
        self.member_ids = [
            f"{self.replication_group_id}-{index:03d}" for index in range(1, config.redis_nodes + 1)
        ]
        self.url: pulumi.Output[str] = pulumi.Output.concat(
            "rediss://", group.primary_endpoint_address, f":{REDIS_PORT}/0"
        )
        self.auth_secret_arn: pulumi.Output[str] = secret.arn
        self.wait_replicas = wait_replicas(config.redis_nodes)
        self.register_outputs({"url": self.url})
