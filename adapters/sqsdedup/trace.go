package sqsdedup

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// attributeCarrier reads a W3C trace context from a message's attributes.
type attributeCarrier map[string]types.MessageAttributeValue

func (c attributeCarrier) Get(key string) string {
	v, ok := c[key]
	if !ok {
		return ""
	}
	return string(attributeBytes(v.StringValue, v.BinaryValue))
}

func (c attributeCarrier) Set(key, value string) {
	c[key] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(value)}
}

func (c attributeCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
