package dedup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Stuck implements [Admin] with a scan of the whole table: it is an
// operator's query, billed as such.
func (s *DynamoDBStore) Stuck(ctx context.Context, scope string, olderThan time.Duration, limit int) ([]Record, error) {
	now := time.Now()
	filter := "#expires_ms > :now AND ((#status = :processing AND #lease < :now) OR (#status = :retryable AND #updated < :before))"
	values := map[string]types.AttributeValue{
		":now":        ddbNum(now.UnixMilli()),
		":before":     ddbNum(now.Add(-olderThan).UnixMilli()),
		":processing": ddbStr(string(StatusProcessing)),
		":retryable":  ddbStr(string(StatusFailedRetryable)),
	}
	names := ddbNames(ddbExpiresMs, ddbStatus)
	names["#lease"], names["#updated"] = ddbLeaseUntil, ddbUpdated
	if scope != "" {
		filter += " AND #scope = :scope"
		names["#scope"] = ddbScope
		values[":scope"] = ddbStr(scope)
	}
	pages := dynamodb.NewScanPaginator(s.client, &dynamodb.ScanInput{
		TableName:                 aws.String(s.table),
		ConsistentRead:            aws.Bool(true),
		FilterExpression:          aws.String(filter),
		ExpressionAttributeNames:  names,
		ExpressionAttributeValues: values,
	})
	var out []Record
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("dedup: dynamodb stuck %s: %w", s.table, err)
		}
		for _, item := range page.Items {
			rec, err := decodeRecord(item)
			if err != nil {
				return nil, fmt.Errorf("dedup: dynamodb stuck %s: %w", s.table, err)
			}
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b Record) int { return a.UpdatedAt.Compare(b.UpdatedAt) })
	return out[:min(len(out), limit)], nil
}

// Forget implements [Admin].
func (s *DynamoDBStore) Forget(ctx context.Context, key Key, owner string) (bool, error) {
	if err := key.Validate(); err != nil {
		return false, fmt.Errorf("dedup: dynamodb forget: %w", err)
	}
	_, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                 aws.String(s.table),
		Key:                       itemKey(key),
		ConditionExpression:       aws.String("#owner = :owner AND #status <> :succeeded"),
		ExpressionAttributeNames:  ddbNames(ddbOwner, ddbStatus),
		ExpressionAttributeValues: map[string]types.AttributeValue{":owner": ddbStr(owner), ":succeeded": ddbStr(string(StatusSucceeded))},
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("dedup: dynamodb forget %s: %w", key, err)
	}
	return true, nil
}
